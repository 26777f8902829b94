"""The live view: ``WS /vnc`` (RFB over websocket), ``GET /view`` (the noVNC page),
``GET /view/status`` (what the page shows of the session's state), ``/view/clipboard``
(its clipboard panel's text, whole: RFB's cut text is Latin-1) and ``POST /view/type``
(the panel's text typed into the session: an input method's text never arrives as keys).

Every one of them takes a ``view`` or ``control`` session token (``?token=`` or bearer
header) or the owner's API key (bearer header), checked before the websocket upgrade:
a refused viewer gets an HTTP error and never an RFB byte. What runs in the viewer's
browser lives in the repository's top-level ``vnc/`` (package data: ``deskbox_server/viewer``
links to it): the page's template ``view.html``, its script and style served under
``/vnc/static``, and the pinned, vendored noVNC under ``/vnc/novnc``.
"""

from __future__ import annotations

import asyncio
import html
import logging
from pathlib import Path
from string import Template
from typing import Annotated

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.staticfiles import StaticFiles

from ..errors import DeskboxError, SessionFailed
from ..schemas.actions import MAX_CLIPBOARD_CHARS, MAX_TYPE_CHARS
from ..schemas.sessions import SessionState
from ..sessions.links import Link, checkpointing
from ..sessions.recorder import Source
from ..sessions.tokens import Scope
from ..vnc.proxy import handshake_server, run_proxy
from ..vnc.rfb import RfbError
from .deps import get_services
from .errors import deskbox_error_response
from .tokens import Grant, authorize, presented_token, until_token_ends

__all__ = [
    "NOVNC_PATH", "STATIC_PATH", "ViewStatus", "ViewerClipboard", "ViewerText", "mount_assets",
    "router",
]

log = logging.getLogger("deskbox.vnc")
router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["live view"])

NOVNC_PATH = "/vnc/novnc"
STATIC_PATH = "/vnc/static"
_VIEWER_DIR = Path(__file__).resolve().parent.parent / "viewer"
_VIEW_SCOPES: tuple[Scope, ...] = ("view", "control")
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the page's URL carries the token
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data: blob:; "
        "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def mount_assets(app: FastAPI) -> None:
    """noVNC and the page's script and style as static routes; the page's template, read
    once here (not in a handler: no file I/O on the event loop)."""
    app.mount(NOVNC_PATH, StaticFiles(directory=_VIEWER_DIR / "novnc"), name="novnc")
    app.mount(STATIC_PATH, StaticFiles(directory=_VIEWER_DIR / "static"), name="vnc-static")
    app.state.view_template = Template((_VIEWER_DIR / "view.html").read_text())


class ViewStatus(BaseModel):
    session_id: str
    state: SessionState
    scope: Scope
    # The handoff (API.md "Human handoff"): a human drives it; its agent asked for help.
    human_in_control: bool = False
    needs_help: bool = False
    reason: str | None = None


@router.get("/view/status", response_model=ViewStatus)
async def view_status(request: Request, session_id: str) -> ViewStatus:
    services = get_services(request)
    grant = await authorize(services, request, session_id, _VIEW_SCOPES)
    record = await services.manager.get(grant.owner, session_id)
    status = ViewStatus(session_id=session_id, state=record.state, scope=grant.scope)
    try:
        # Only a session this server holds can be under a human's control (one server
        # keeps the handoff: one_server_only).
        handoff = services.manager.held(grant.owner, session_id, "live").handoff.resource()
    except DeskboxError:
        return status  # it ended meanwhile, or another server of the fleet serves it
    status.human_in_control, status.needs_help = handoff.human_in_control, handoff.needs_help
    status.reason = handoff.reason
    return status


class ViewerClipboard(BaseModel):
    """The session's clipboard as the live view's panel shows and pastes it."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Field(max_length=MAX_CLIPBOARD_CHARS)]


@router.get("/view/clipboard", response_model=ViewerClipboard)
async def view_clipboard(request: Request, session_id: str) -> ViewerClipboard:
    """What the session copied, whole (the panel asks when RFB's Latin-1 cut text says it
    changed); a ``view`` or ``control`` token."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, _VIEW_SCOPES)
    session = await services.manager.session(grant.owner, session_id)
    return ViewerClipboard(text=await session.viewer_clipboard())


@router.post("/view/clipboard", status_code=204, response_class=Response)
async def paste_from_viewer(
    request: Request, session_id: str, body: ViewerClipboard
) -> Response:
    """The panel's text onto the session's clipboard, any Unicode; a ``control`` token."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, "control")
    session = await services.manager.session(grant.owner, session_id)
    await session.viewer_paste(body.text, _source(grant))
    return Response(status_code=204)


class ViewerText(BaseModel):
    """Text the live view's panel types into the session."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Field(min_length=1, max_length=MAX_TYPE_CHARS)]


@router.post("/view/type", status_code=204, response_class=Response)
async def type_from_viewer(request: Request, session_id: str, body: ViewerText) -> Response:
    """The panel's text typed into the focused window as the ``type`` action types it (any
    Unicode); a ``control`` token. Answered once it is typed."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, "control")
    session = await services.manager.session(grant.owner, session_id)
    await session.viewer_type(body.text, _source(grant))
    return Response(status_code=204)


def _source(grant: Grant) -> Source:
    """Who a recording names for what a viewer did."""
    if grant.token_id:
        return {"type": "token", "id": grant.token_id}
    return {"type": "api_key", "id": grant.owner}


@router.get("/view", response_class=HTMLResponse)
async def view_page(request: Request, session_id: str) -> HTMLResponse:
    services = get_services(request)
    if presented_token(request) is not None:
        grant = await authorize(services, request, session_id, _VIEW_SCOPES)
        await services.manager.get(grant.owner, session_id)
    # Without a credential, the page alone: it holds nothing of the session and opens
    # nothing, and its calls carry the token its tab kept when the page took it out of the
    # address bar (static/live.js takeToken), so that a reload still works.
    template: Template = request.app.state.view_template
    page = template.substitute(
        session_id=html.escape(session_id, quote=True), static=STATIC_PATH, novnc=NOVNC_PATH
    )
    return HTMLResponse(page, headers=_PAGE_HEADERS)


@router.websocket("/vnc")
async def vnc_ws(websocket: WebSocket, session_id: str) -> None:
    """RFB over websocket (subprotocol ``binary`` when offered); many viewers at once."""
    services = get_services(websocket)
    accepted = False
    link: Link | None = None
    try:
        grant = await authorize(services, websocket, session_id, _VIEW_SCOPES)
        session = await services.manager.session(grant.owner, session_id)
        session.ensure_running()
        upstream: list[asyncio.StreamWriter] = []

        async def close_for_checkpoint() -> None:
            # The viewer sees the server end the stream (1011) and may reconnect.
            for writer in upstream:
                writer.close()

        async with (
            services.manager.links.hold(session_id, close_for_checkpoint) as link,
            services.vnc.viewer(session_id, session.start_vnc,
                                services.settings.retry_after_s) as server,
        ):
            reader, writer = await server.connect()
            upstream.append(writer)
            if link.closing:  # a checkpoint began while this viewer connected
                writer.close()
                raise checkpointing(session_id)
            try:
                await handshake_server(reader, writer)
                offered = websocket.scope.get("subprotocols") or []
                await websocket.accept(subprotocol="binary" if "binary" in offered else None)
            except (RfbError, TimeoutError) as error:
                writer.close()
                raise SessionFailed(f"the session's VNC server failed: {error}") from None
            except BaseException:
                # The viewer hung up before it was accepted (uvicorn's ClientDisconnected
                # is an OSError): its VNC connection and agent stream go now, not when the
                # last viewer leaves.
                writer.close()
                raise
            accepted = True
            viewer_id = f"viewer-{id(websocket):x}"
            source = _source(grant)
            control = grant.scope == "control"
            try:
                stats = await run_proxy(
                    websocket, reader, writer, allow_input=control,
                    max_buffer=services.settings.vnc_viewer_buffer_bytes,
                    send_timeout_s=services.settings.ws_send_timeout_s,
                    on_input=lambda message: session.human_input(viewer_id, source, message),
                    ends=until_token_ends(services, websocket, session_id, _VIEW_SCOPES),
                    type_key=session.viewer_key if control else None,
                )
            finally:
                session.human_left(viewer_id)
            if stats.too_slow:
                services.metrics.slow_clients.inc("vnc")
            log.info(
                "session %s: %s viewer %s (%d messages forwarded, %d input dropped)",
                session_id, grant.scope, "dropped: too slow" if stats.too_slow else "left",
                stats.messages, stats.dropped,
            )
    except DeskboxError as raised:
        # What a checkpoint did to the connection being made (its VNC server or stream gone)
        # is not the viewer's failure: it may connect again once the session runs.
        ended = checkpointing(session_id) if (
            not accepted and link is not None and link.closing) else raised
        services.metrics.errors.inc(ended.kind)
        if not accepted:
            await websocket.send_denial_response(deskbox_error_response(ended))
        else:
            log.warning("session %s: live view ended: %s", session_id, ended.message)
