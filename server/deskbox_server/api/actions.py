"""Actions on a session: ``POST /actions``, ``GET /screenshot`` and ``WS /actions/ws``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from .. import untrusted_json
from ..errors import DeskboxError, Internal, InvalidRequest
from ..media import EncodedImage
from ..schemas import actions as a
from ..schemas.batch import (
    ActionResultOut,
    ActionsRequest,
    ActionsResponse,
    EmptyResult,
    ImageOut,
    WsImage,
    WsRequest,
)
from ..schemas.results import ActionResult, ClipboardText, Point, Size
from ..sessions.pause import FROZEN_HEADER
from .auth import authenticate
from .deps import Caller, Services, get_services
from .errors import deskbox_error_response, error_body, new_request_id, validation_message
from .refusals import (
    RecordsQueryRefusals,
    RecordsRefusals,
    record_owners_refused,
    record_refused_query,
)
from .replies import encodes_on_loop, json_on_thread

__all__ = [
    "CLOSE_STALLED", "MAX_IN_FLIGHT", "SIZE_PATTERN", "ClientStalled", "parse_size", "router",
]

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["actions"],
                   route_class=RecordsRefusals)

MAX_IN_FLIGHT = 64
CLOSE_STALLED = 1008  # policy violation: the client must read its replies
_CLOSE_TIMEOUT_S = 1.0
SIZE_PATTERN = r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$"  # documented; parse_size() checks
_SCALE = re.compile(SIZE_PATTERN)


def _image_out(image: EncodedImage) -> ImageOut:
    return ImageOut(
        media_type=image.media_type,
        data_b64=base64.b64encode(image.data).decode("ascii"),
        width=image.width,
        height=image.height,
    )


def _result_out(result: ActionResult) -> ActionResultOut:
    if isinstance(result, EncodedImage):
        return _image_out(result)
    if isinstance(result, Point | Size | ClipboardText):
        return result
    return EmptyResult()


@router.post("/actions", response_model=ActionsResponse, response_model_exclude_none=True)
async def run_actions(
    request: Request, caller: Caller, session_id: str, body: ActionsRequest
) -> ActionsResponse | Response:
    session = await get_services(request).manager.session(caller.key_id, session_id)
    batch = await session.act(body.actions, body.coordinate_space, body.screenshot)

    def reply() -> ActionsResponse:
        return ActionsResponse(
            results=[_result_out(r) for r in batch.results],
            screenshot=_image_out(batch.screenshot) if batch.screenshot else None,
            settled=batch.settled,
        )

    images = [batch.screenshot, *(r for r in batch.results if isinstance(r, EncodedImage))]
    if encodes_on_loop(images):
        return reply()
    return await json_on_thread(reply, exclude_none=True)


def parse_size(value: str, name: str) -> tuple[int, int]:
    """A ``WIDTHxHEIGHT`` query value (``scale``, ``coordinate_space``) → (width, height)."""
    match = _SCALE.match(value)
    if match is None:
        raise InvalidRequest(f"{name} {value!r} is not of the form WIDTHxHEIGHT (e.g. 1024x640)")
    return int(match[1]), int(match[2])


def _scale(value: str | None) -> a.ScaleTo | None:
    if value is None:
        return None
    width, height = parse_size(value, "scale")
    try:
        return a.ScaleTo(width=width, height=height)
    except ValidationError as error:
        raise InvalidRequest(validation_message(error.errors())) from None


async def screenshot(
    request: Request,
    caller: Caller,
    session_id: str,
    format: Literal["jpeg", "png", "webp"] = "jpeg",  # noqa: A002 (the API's name)
    quality: Annotated[int, Query(ge=1, le=100)] = 75,
    scale: Annotated[str | None, Query(description="WIDTHxHEIGHT",
                                       json_schema_extra={"pattern": SIZE_PATTERN})] = None,
) -> Response:
    session = await get_services(request).manager.session(caller.key_id, session_id)
    try:
        scaled = _scale(scale)
    except InvalidRequest as error:  # kept, as a query FastAPI refuses is (refusals.py)
        record_refused_query(request, error)
        raise
    # A paused session's screen is its last frame, captured when it was paused.
    image, frozen = await session.screenshot(format, quality, scaled)
    headers = {FROZEN_HEADER: "true"} if frozen else {}
    headers |= {"X-Image-Width": str(image.width), "X-Image-Height": str(image.height)}
    return Response(content=image.data, media_type=image.media_type, headers=headers)


# A GET of no body: the route's class keeps a refused query as the screenshot it asked for.
router.add_api_route(
    "/screenshot", screenshot, methods=["GET"], response_class=Response,
    responses={200: {"content": {"image/jpeg": {}, "image/png": {}, "image/webp": {}}}},
    route_class_override=RecordsQueryRefusals,
)


# -- websocket ----------------------------------------------------------------------------

Reply = tuple[str, list[bytes]]


def _error_reply(message_id: object, error: DeskboxError) -> Reply:
    body = error_body(error.kind, error.message, new_request_id(), error.action_index)
    return json.dumps({"id": message_id, "ok": False, "error": body}), []


def _image_announcement(image: EncodedImage) -> dict[str, object]:
    return WsImage(
        media_type=image.media_type, width=image.width, height=image.height, size=len(image.data)
    ).model_dump()


def _raw_json(text: str) -> object:
    try:
        return untrusted_json.loads(text)
    except ValueError:
        return None


def _raw_id(data: object) -> object:
    message_id = data.get("id") if isinstance(data, dict) else None
    return message_id if isinstance(message_id, int | str) else None


async def _handle_message(services: Services, owner: str, session_id: str, text: str) -> Reply:
    """Parse and run one message. Up to the driver call nothing awaits: order is kept."""
    try:
        message = WsRequest.model_validate_json(text)
    except ValidationError as error:
        refusal = InvalidRequest(validation_message(error.errors()))
        data = _raw_json(text)
        # Kept as sent, as POST /actions's are (refusals.py): its action, if it reads as one.
        sent = data.get("action") if isinstance(data, dict) else None
        actions = [sent] if isinstance(sent, dict) and isinstance(sent.get("type"), str) else None
        record_owners_refused(services, owner, session_id, data, actions, refusal)
        return _error_reply(_raw_id(data), refusal)
    try:
        session = await services.manager.session(owner, session_id)
        batch = await session.act([message.action], message.coordinate_space, message.screenshot)
    except DeskboxError as error:
        return _error_reply(message.id, error)
    except Exception:
        return _error_reply(message.id, Internal("the action failed inside the server"))
    frames: list[bytes] = []
    reply: dict[str, object] = {"id": message.id, "ok": True}
    result = batch.results[0]
    if isinstance(result, EncodedImage):
        reply["result"] = _image_announcement(result)
        frames.append(result.data)
    else:
        reply["result"] = _result_out(result).model_dump()
    if batch.screenshot is not None:
        reply["screenshot"] = _image_announcement(batch.screenshot)
        reply["settled"] = batch.settled
        frames.append(batch.screenshot.data)
    if frames:
        reply["binary_frames"] = len(frames)
    return json.dumps(reply), frames


@router.websocket("/actions/ws")
async def actions_ws(websocket: WebSocket, session_id: str) -> None:
    """One action per text message; replies in request order; images as binary frames.

    ``{"id": 7, "action": {...}}`` → ``{"id": 7, "ok": true, "result": {...}}``. A reply
    that announces images (``"binary_frames": n``) is followed by n binary frames: the
    action's image first, then the settled ``screenshot`` if one was asked for.
    """
    services = get_services(websocket)
    try:
        owner = authenticate(services.keyring, websocket).key_id
        (await services.manager.session(owner, session_id)).ensure_running()
    except DeskboxError as error:
        services.metrics.errors.inc(error.kind)
        await websocket.send_denial_response(deskbox_error_response(error))
        return
    await websocket.accept()
    pending: asyncio.Queue[asyncio.Task[Reply] | None] = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
    tasks: set[asyncio.Task[Reply]] = set()
    timeout_s = services.settings.ws_send_timeout_s

    largest = services.settings.max_request_bytes

    async def handle(text: str | None) -> Reply:
        if text is None:
            return _error_reply(None, InvalidRequest("send actions as JSON text messages"))
        if len(text) > largest:  # characters: at most as many as its bytes
            return _error_reply(None, InvalidRequest(
                f"a message over {largest} bytes (DESKBOX_MAX_REQUEST_BYTES)"))
        return await _handle_message(services, owner, session_id, text)

    async def read_requests() -> None:
        while True:
            received = await websocket.receive()
            if received["type"] == "websocket.disconnect":
                return
            task = asyncio.create_task(handle(received.get("text")))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            # Waits while MAX_IN_FLIGHT replies are unsent: the client's requests stay in
            # its socket (uvicorn reads one message at a time), not in our memory.
            await pending.put(task)

    sender = asyncio.create_task(_send_replies(websocket, pending, timeout_s))
    reader = asyncio.create_task(read_requests())
    try:
        await asyncio.wait({reader, sender}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        reader.cancel()
        if not sender.done():
            try:
                pending.put_nowait(None)
            except asyncio.QueueFull:
                sender.cancel()
        # Actions already handed to the desktop finish there; their replies have nowhere
        # to go once the client is gone.
        await asyncio.gather(reader, sender, *tasks, return_exceptions=True)
        stalled = not sender.cancelled() and isinstance(sender.exception(), ClientStalled)
        if stalled:
            services.metrics.slow_clients.inc("actions")
        if websocket.client_state is WebSocketState.CONNECTED:
            code, reason = 1000, ""
            if stalled:
                code, reason = CLOSE_STALLED, f"no reply taken for {timeout_s:g} s"
            # A stalled client cannot take the close frame either: give up on it after a
            # moment (the socket and its buffer go when the client reads or leaves).
            with contextlib.suppress(RuntimeError, TimeoutError, WebSocketDisconnect):
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await websocket.close(code, reason)


class ClientStalled(Exception):
    """The client took no reply for ``ws_send_timeout_s`` while replies waited."""


async def _send_replies(
    websocket: WebSocket, pending: asyncio.Queue[asyncio.Task[Reply] | None], timeout_s: float
) -> None:
    """Replies in request order. A send waits while the socket's buffer is full (uvicorn's
    flow control): a client that reads nothing for ``timeout_s`` is given up on, and with
    it the replies it holds (at most MAX_IN_FLIGHT of them)."""
    while (task := await pending.get()) is not None:
        text, frames = await task
        try:
            async with asyncio.timeout(timeout_s):
                await websocket.send_text(text)
                for frame in frames:
                    await websocket.send_bytes(frame)
        except TimeoutError:
            raise ClientStalled(f"no reply taken for {timeout_s:g} s") from None
