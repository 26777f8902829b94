"""What routers need from the app (wired by ``create_app``), as FastAPI dependencies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from .. import untrusted_json
from ..errors import InvalidRequest
from ..metrics import Metrics
from ..sessions.manager import SessionManager
from ..sessions.tokens import TokenStore
from ..settings import Settings
from ..vnc.hub import VncHub
from .auth import KeyRing, Principal, authenticate

__all__ = ["NO_BODY", "Caller", "Services", "get_services", "require_key"]


@dataclass(frozen=True)
class Services:
    settings: Settings
    keyring: KeyRing
    manager: SessionManager
    metrics: Metrics
    tokens: TokenStore = field(default_factory=TokenStore)  # session tokens (api/tokens.py)
    vnc: VncHub = field(default_factory=VncHub)  # VNC servers of the live view


def get_services(connection: HTTPConnection) -> Services:
    services = connection.app.state.services
    assert isinstance(services, Services)
    return services


async def require_key(request: Request) -> Principal:
    # A coroutine, though it never waits: FastAPI runs a plain function dependency on its
    # thread pool, a thread hop on every request for a few microseconds of work.
    return authenticate(get_services(request).keyring, request)


Caller = Annotated[Principal, Depends(require_key)]


async def refuse_body(request: Request, _: Caller) -> None:
    """A POST that takes no body refuses one with content (422) rather than ignore it: an
    option the endpoint does not have (a snapshot's "name") is not taken for done. After
    the key's check (FastAPI runs that once per request)."""
    raw = await request.body()
    if not raw.strip():
        return
    try:
        value = untrusted_json.loads(raw)
    except ValueError:
        value = raw
    if value == {} or value is None:
        return
    fields = f": it has {', '.join(sorted(map(str, value)))}" if isinstance(value, dict) else ""
    raise InvalidRequest(f"{request.method} {request.url.path} takes no body, or {{}}{fields}")


# ``dependencies=NO_BODY`` on a route whose request has no body.
NO_BODY = [Depends(refuse_body)]
