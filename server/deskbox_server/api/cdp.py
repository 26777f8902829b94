"""The session browser's Chrome DevTools Protocol, through the control plane (API.md).

``GET .../cdp/json/version`` and ``.../cdp/json/list`` (also ``.../cdp/json``) answer what
the browser's own endpoints answer, with every websocket URL rewritten to come back here:
the browser-level socket is ``WS .../cdp``, a target's is ``WS .../cdp/page/{target_id}``.
So ``playwright.chromium.connect_over_cdp(session.urls.cdp_http)`` works unchanged: it
fetches ``/json/version/`` and follows ``webSocketDebuggerUrl``. A ``?token=`` the request
carried is carried into the URLs it is given; a bearer header is not (the client sends it
again). ``devtoolsFrontendUrl`` is dropped: it names the browser's own address.

Auth: a ``cdp`` session token (``?token=`` or bearer) or the owner's API key (bearer),
checked when the request or the websocket arrives. The browser's port is reachable only
from inside the sandbox (the session opens it); the proxy relays messages (cdp_relay.py),
each at most ``cdp_max_message_bytes`` (larger: close 1009), at most
:data:`MAX_SOCKETS_PER_SESSION` sockets per session, and closes a client that falls
behind the browser (1008) with what waits for it bounded per client and per session. When
the browser goes away (it exited, the session ended) the client gets a close frame: 1001
with a reason.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection

from ..errors import BrowserUnavailable, Capacity, Conflict, DeskboxError, InvalidRequest
from ..sessions import Session
from ..sessions.links import RESTART_CLOSE_CODE
from .cdp_relay import RelayLimits, SessionBuffers, relay
from .deps import Services, get_services
from .errors import deskbox_error_response
from .tokens import authorize, until_token_ends

__all__ = ["rewrite_targets", "rewrite_version", "router"]

router = APIRouter(prefix="/v1/sessions/{session_id}/cdp", tags=["cdp"])
log = logging.getLogger("deskbox.cdp")

_TARGET_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_PAGE_PATH = re.compile(r"^/devtools/page/([A-Za-z0-9_-]{1,128})$")
MAX_SOCKETS_PER_SESSION = 32


def _with_token(url: str, token: str | None) -> str:
    return f"{url}?token={quote(token, safe='')}" if token else url


def rewrite_version(version: object, base: str, token: str | None) -> dict[str, Any]:
    """``/json/version`` with its browser websocket replaced by ``base`` (``ws://.../cdp``)."""
    if not isinstance(version, dict):
        raise BrowserUnavailable("the browser's /json/version is not an object")
    out = {key: value for key, value in version.items() if key != "webSocketDebuggerUrl"}
    out["webSocketDebuggerUrl"] = _with_token(base, token)
    return out


def rewrite_targets(targets: object, base: str, token: str | None) -> list[dict[str, Any]]:
    """``/json/list`` with each target's websocket replaced by ``base/page/<id>``."""
    if not isinstance(targets, list):
        raise BrowserUnavailable("the browser's /json/list is not a list")
    out: list[dict[str, Any]] = []
    for target in targets:
        if not isinstance(target, dict):
            continue
        entry = {
            key: value for key, value in target.items()
            if key not in ("webSocketDebuggerUrl", "devtoolsFrontendUrl")
        }
        url = target.get("webSocketDebuggerUrl")
        try:
            path = urlsplit(url).path if isinstance(url, str) else ""
        except ValueError:  # "ws://[x/...": the sandbox's answer, not to be trusted
            path = ""
        match = _PAGE_PATH.match(path)
        if match is not None:
            entry["webSocketDebuggerUrl"] = _with_token(f"{base}/page/{match[1]}", token)
        out.append(entry)
    return out


def _ws_base(connection: HTTPConnection, session_id: str) -> str:
    http = str(connection.base_url).rstrip("/")
    scheme = "wss" if http.startswith("https:") else "ws"
    return f"{scheme}://{http.split('://', 1)[1]}/v1/sessions/{session_id}/cdp"


async def _session(
    services: Services, connection: HTTPConnection, session_id: str
) -> tuple[str, Session]:
    grant = await authorize(services, connection, session_id, "cdp")
    session = await services.manager.session(grant.owner, session_id)
    session.ensure_running()
    return grant.owner, session


async def _listing(request: Request, session_id: str, path: str) -> object:
    _, session = await _session(get_services(request), request, session_id)
    return await session.devtools_json(path)


@router.get("/json/version", include_in_schema=True)
@router.get("/json/version/", include_in_schema=False)
async def json_version(request: Request, session_id: str) -> JSONResponse:
    """The browser's ``/json/version``; ``webSocketDebuggerUrl`` leads to ``WS .../cdp``."""
    version = await _listing(request, session_id, "/json/version")
    token = request.query_params.get("token")
    return JSONResponse(rewrite_version(version, _ws_base(request, session_id), token))


@router.get("/json/list", include_in_schema=True)
@router.get("/json/list/", include_in_schema=False)
@router.get("/json", include_in_schema=False)
@router.get("/json/", include_in_schema=False)
async def json_list(request: Request, session_id: str) -> JSONResponse:
    """The browser's targets; each ``webSocketDebuggerUrl`` leads to ``WS .../cdp/page/{id}``."""
    targets = await _listing(request, session_id, "/json/list")
    token = request.query_params.get("token")
    return JSONResponse(rewrite_targets(targets, _ws_base(request, session_id), token))


@router.websocket("")
async def browser_socket(websocket: WebSocket, session_id: str) -> None:
    """The browser-level DevTools socket (what ``connect_over_cdp`` uses)."""
    await _proxy(websocket, session_id, None)


@router.websocket("/page/{target_id}")
async def page_socket(websocket: WebSocket, session_id: str, target_id: str) -> None:
    """One target's DevTools socket, as ``/json/list`` names them."""
    await _proxy(websocket, session_id, target_id)


@dataclass
class _SessionRelays:
    """One session's proxied DevTools sockets and what they hold for their clients."""

    buffers: SessionBuffers
    sockets: int = 0


def _session_relays(connection: HTTPConnection, session_id: str, limit: int) -> _SessionRelays:
    """Kept on the app (made on first use) while the session has sockets open."""
    state = connection.app.state
    if not hasattr(state, "cdp_relays"):
        state.cdp_relays = {}
    relays: dict[str, _SessionRelays] = state.cdp_relays
    if session_id not in relays:
        relays[session_id] = _SessionRelays(SessionBuffers(limit))
    return relays[session_id]


def _forget_if_idle(connection: HTTPConnection, session_id: str) -> None:
    relays: dict[str, _SessionRelays] = connection.app.state.cdp_relays
    if session_id in relays and not relays[session_id].sockets:
        del relays[session_id]


async def _proxy(websocket: WebSocket, session_id: str, target_id: str | None) -> None:
    services = get_services(websocket)
    settings = services.settings
    limit = settings.cdp_max_message_bytes
    limits = RelayLimits(limit, settings.cdp_client_buffer_bytes, settings.ws_send_timeout_s)
    session: _SessionRelays | None = None
    counted = False
    try:
        try:
            owner, browser = await _session(services, websocket, session_id)
            # Looked up after the wait (a fleet's token check reads the cluster): an entry
            # taken before it could be forgotten meanwhile by a socket that ended, and a
            # socket counted on it escaped the cap and the session's buffer budget.
            session = _session_relays(websocket, session_id, settings.cdp_session_buffer_bytes)
            if session.sockets >= MAX_SOCKETS_PER_SESSION:
                raise Capacity(
                    f"session {session_id} has {MAX_SOCKETS_PER_SESSION} DevTools connections "
                    "open; close one first", settings.retry_after_s,
                )
            session.sockets += 1  # no await since the lookup
            counted = True
            if target_id is None:
                path = await browser.devtools_browser_path()
            elif _TARGET_ID.match(target_id):
                path = f"/devtools/page/{target_id}"
            else:
                raise InvalidRequest(f"{target_id!r} is not a DevTools target id")
            upstream = await browser.devtools_websocket(path, limit)
        except DeskboxError as error:
            services.metrics.errors.inc(error.kind)
            await websocket.send_denial_response(deskbox_error_response(error))
            return

        async def close_for_checkpoint() -> None:
            # The client sees the browser's side close (1001) and may reconnect.
            await upstream.close(RESTART_CLOSE_CODE, "session checkpoint")

        def dropped(reason: str) -> None:
            log.info("session %s: DevTools client dropped: %s", session_id, reason)
            services.metrics.slow_clients.inc("cdp")

        def touch() -> None:
            with contextlib.suppress(DeskboxError):
                services.manager.held(owner, session_id).touch()

        try:
            async with services.manager.links.hold(session_id, close_for_checkpoint):
                await websocket.accept()
                await relay(websocket, upstream, session.buffers, limits, touch, dropped,
                            until_token_ends(services, websocket, session_id, "cdp"))
        except Conflict as error:  # refused by hold(): the session is being checkpointed
            services.metrics.errors.inc(error.kind)
            await websocket.send_denial_response(deskbox_error_response(error))
        finally:
            await upstream.close()
    finally:
        if session is not None:  # None: refused before the session's relays were looked up
            if counted:
                session.sockets -= 1
            _forget_if_idle(websocket, session_id)
