"""``/v1/sessions/{id}/tokens`` and how routers accept a session token.

``POST`` issues a token (the API key must own the session); ``DELETE .../{token_id}``
revokes it. Routers that browsers or Playwright open (VNC, the view page, CDP) call
:func:`authorize`: a session token from ``?token=`` or the bearer header, or the owner's API
key in the bearer header (which holds every scope).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Collection
from dataclasses import dataclass

from fastapi import APIRouter, Request, Response
from starlette.requests import HTTPConnection

from ..errors import DeskboxError, Forbidden, NotFound, Unauthorized
from ..schemas.tokens import TokenCreate, TokenIssued
from ..sessions.lifecycle import LIVE_STATES
from ..sessions.tokens import Scope, looks_like_token
from .deps import Caller, Services, get_services

__all__ = ["Grant", "authorize", "presented_token", "router", "until_token_ends"]

router = APIRouter(prefix="/v1/sessions/{session_id}/tokens", tags=["tokens"])
log = logging.getLogger("deskbox.tokens")


@router.post("", status_code=201, response_model=TokenIssued)
async def issue_token(
    request: Request, caller: Caller, session_id: str, body: TokenCreate
) -> TokenIssued:
    services = get_services(request)
    session = await services.manager.get(caller.key_id, session_id)  # 404 unless it's theirs
    if session.state not in LIVE_STATES:
        # Its link would open nothing: a viewer or DevTools client is refused at once.
        raise NotFound(f"session {session_id} is {session.state.value}")
    token, record = await services.tokens.issue(caller.key_id, session_id, body.scope, body.ttl_s)
    return TokenIssued(
        id=record.id, token=token, scope=record.scope, session_id=session_id,
        expires_at=record.expires_at_utc,
    )


@router.delete("/{token_id}", status_code=204, response_class=Response)
async def revoke_token(
    request: Request, caller: Caller, session_id: str, token_id: str
) -> Response:
    services = get_services(request)
    await services.manager.get(caller.key_id, session_id)
    await services.tokens.revoke(caller.key_id, session_id, token_id)
    return Response(status_code=204)


@dataclass(frozen=True)
class Grant:
    """Who may do what on a session: the owner's key id and the scope granted."""

    owner: str
    scope: Scope
    token_id: str | None  # None: the owner's API key itself


# How often a live connection's session token is looked at again (revoked?): a dict
# lookup here; in a fleet a read of the cluster's records, so less often.
_RECHECK_S, _RECHECK_SHARED_S = 1.0, 10.0
TOKEN_ENDED = "the session token was revoked or expired"


async def until_token_ends(
    services: Services, connection: HTTPConnection, session_id: str,
    scopes: Scope | Collection[Scope],
) -> str:
    """Returns once the session token the connection was opened with no longer holds
    (revoked, expired), with the reason to close it with; never for an API key (a
    connection opened with one lasts as long as the key is configured).

    A token is checked when a connection opens; one kept open (a viewer, a DevTools
    client) outlived its revocation and its expiry."""
    credential = presented_token(connection)
    if credential is None or not looks_like_token(credential):
        await asyncio.Event().wait()  # forever: the caller cancels it
    assert credential is not None
    every = _RECHECK_SHARED_S if services.tokens.shared else _RECHECK_S
    expires_at = math.inf  # as last seen: a lookup that fails keeps it no longer than that
    while True:
        try:
            record = await services.tokens.verify(credential, session_id, scopes)
        except (Unauthorized, Forbidden):
            return TOKEN_ENDED
        except NotFound as error:  # the session ended: not a lookup to try again
            return error.message
        except DeskboxError as error:
            # The fleet's records out of reach for a moment (the cluster's API timed out or
            # throttled): the token was not revoked, and its viewers stay.
            if time.time() >= expires_at:
                return TOKEN_ENDED
            log.warning("session %s: a session token could not be checked again (%s); "
                        "trying again in %.0f s", session_id, error.message, every)
            await asyncio.sleep(every)
            continue
        expires_at = record.expires_at
        await asyncio.sleep(max(0.0, min(every, expires_at - time.time()) + 0.01))


def presented_token(connection: HTTPConnection) -> str | None:
    """``?token=`` if given, else the bearer credential, else None."""
    token = connection.query_params.get("token")
    if token:
        return token
    scheme, _, credential = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        return credential.strip()
    return None


async def authorize(
    services: Services, connection: HTTPConnection, session_id: str,
    scopes: Scope | Collection[Scope],
) -> Grant:
    """A session token for ``session_id`` and one of ``scopes``, or the owner's API key.

    Raises Unauthorized/Forbidden (never mentioning the credential). An API key is accepted
    only in the header; whether the key owns the session is the caller's check (the
    session manager's lookups by owner answer 404 otherwise).
    """
    wanted: tuple[Scope, ...] = (scopes,) if isinstance(scopes, str) else tuple(scopes)
    credential = presented_token(connection)
    if credential is None:
        raise Unauthorized("missing token: add ?token=<session token> (or a bearer header)")
    if looks_like_token(credential):
        record = await services.tokens.verify(credential, session_id, wanted)
        return Grant(record.owner, record.scope, record.id)
    if connection.query_params.get("token"):
        raise Unauthorized("invalid session token (unknown, revoked or expired)")
    principal = services.keyring.identify(credential)
    if principal is None:
        raise Unauthorized("invalid API key or session token")
    best: Scope = "control" if "control" in wanted else wanted[0]
    return Grant(principal.key_id, best, None)
