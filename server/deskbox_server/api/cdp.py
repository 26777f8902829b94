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
from inside the sandbox (backends/devtools.py); the proxy relays messages one at a time,
each at most ``cdp_max_message_bytes`` (larger: close 1009), at most
:data:`MAX_SOCKETS_PER_SESSION` sockets per session. When the browser goes away (it
exited, the session ended) the client gets a close frame: 1001 with a reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..backends.base import DesktopHandle
from ..backends.devtools import (
    MAX_LISTING,
    BrowserUnavailable,
    browser_path,
    get_json,
    open_websocket,
)
from ..errors import Capacity, Conflict, DeskboxError, InvalidRequest
from ..sessions.links import RESTART_CLOSE_CODE
from .deps import Services, get_services
from .errors import deskbox_error_response
from .tokens import authorize

__all__ = ["rewrite_targets", "rewrite_version", "router"]

router = APIRouter(prefix="/v1/sessions/{session_id}/cdp", tags=["cdp"])

_TARGET_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_PAGE_PATH = re.compile(r"^/devtools/page/([A-Za-z0-9_-]{1,128})$")
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009
_TOUCH_EVERY_S = 1.0
MAX_SOCKETS_PER_SESSION = 32
# A close reason has at most 123 bytes.
_BROWSER_CLOSED = (
    "the browser closed this DevTools connection (target closed, browser restarting or "
    "session ended)"
)


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
        match = _PAGE_PATH.match(urlsplit(url).path) if isinstance(url, str) else None
        if match is not None:
            entry["webSocketDebuggerUrl"] = _with_token(f"{base}/page/{match[1]}", token)
        out.append(entry)
    return out


def _ws_base(connection: HTTPConnection, session_id: str) -> str:
    http = str(connection.base_url).rstrip("/")
    scheme = "wss" if http.startswith("https:") else "ws"
    return f"{scheme}://{http.split('://', 1)[1]}/v1/sessions/{session_id}/cdp"


def _handle(
    services: Services, connection: HTTPConnection, session_id: str
) -> tuple[str, DesktopHandle]:
    grant = authorize(services, connection, session_id, "cdp")
    return grant.owner, services.manager.handle(grant.owner, session_id)


async def _listing(request: Request, session_id: str, path: str) -> object:
    services = get_services(request)
    _, handle = _handle(services, request, session_id)
    return await get_json(await handle.open_devtools(), path, MAX_LISTING)


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


def _open_sockets(connection: HTTPConnection) -> dict[str, int]:
    """Proxied DevTools sockets per session, kept on the app (made on first use)."""
    state = connection.app.state
    if not hasattr(state, "cdp_sockets"):
        state.cdp_sockets = {}
    counts: dict[str, int] = state.cdp_sockets
    return counts


async def _proxy(websocket: WebSocket, session_id: str, target_id: str | None) -> None:
    services = get_services(websocket)
    limit = services.settings.cdp_max_message_bytes
    counts = _open_sockets(websocket)
    counted = False
    try:
        try:
            owner, handle = _handle(services, websocket, session_id)
            if counts.get(session_id, 0) >= MAX_SOCKETS_PER_SESSION:
                raise Capacity(
                    f"session {session_id} has {MAX_SOCKETS_PER_SESSION} DevTools connections "
                    "open; close one first", services.settings.retry_after_s,
                )
            counts[session_id] = counts.get(session_id, 0) + 1  # no await since the check
            counted = True
            if target_id is None:
                path = await browser_path(handle.open_devtools)
            elif _TARGET_ID.match(target_id):
                path = f"/devtools/page/{target_id}"
            else:
                raise InvalidRequest(f"{target_id!r} is not a DevTools target id")
            upstream = await open_websocket(handle.open_devtools, path, limit)
        except DeskboxError as error:
            services.metrics.errors.inc(error.kind)
            await websocket.send_denial_response(deskbox_error_response(error))
            return
        async def close_for_checkpoint() -> None:
            # The client sees the browser's side close (1001) and may reconnect.
            await upstream.close(RESTART_CLOSE_CODE, "session checkpoint")

        try:
            async with services.manager.links.hold(session_id, close_for_checkpoint):
                await websocket.accept()
                await _relay(websocket, upstream, services, owner, session_id, limit)
        except Conflict as error:  # refused by hold(): the session is being checkpointed
            services.metrics.errors.inc(error.kind)
            await websocket.send_denial_response(deskbox_error_response(error))
        finally:
            await upstream.close()
    finally:
        if counted:
            counts[session_id] -= 1
            if not counts[session_id]:
                del counts[session_id]


async def _relay(
    websocket: WebSocket, upstream: ClientConnection, services: Services, owner: str,
    session_id: str, limit: int,
) -> None:
    """Both directions until either side closes; the other is then closed with a reason."""
    touched = 0.0

    async def from_client() -> tuple[int, str] | None:
        nonlocal touched
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            data: str | bytes | None = message.get("text")
            if data is None:
                data = message.get("bytes") or b""
            if len(data) > limit:
                return CLOSE_TOO_BIG, f"a DevTools message may be at most {limit} bytes"
            await upstream.send(data)
            now = time.monotonic()
            if now - touched > _TOUCH_EVERY_S:  # CDP use keeps the session from expiring
                touched = now
                with contextlib.suppress(DeskboxError):
                    services.manager.touch(owner, session_id)

    async def from_browser() -> tuple[int, str]:
        try:
            async for data in upstream:
                if isinstance(data, str):
                    await websocket.send_text(data)
                else:
                    await websocket.send_bytes(data)
        except ConnectionClosed as closed:
            if closed.sent is not None and closed.sent.code == CLOSE_TOO_BIG:
                return CLOSE_TOO_BIG, f"the browser sent a message larger than {limit} bytes"
        return CLOSE_GOING_AWAY, _BROWSER_CLOSED

    tasks = [asyncio.create_task(from_client()), asyncio.create_task(from_browser())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    close: tuple[int, str] | None = None
    for task, result in zip(tasks, results, strict=True):
        if task in done and isinstance(result, tuple):
            close = result
    if close is not None:
        with contextlib.suppress(RuntimeError, WebSocketDisconnect, OSError):
            await websocket.close(close[0], close[1][:120])
