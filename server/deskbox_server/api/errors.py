"""The one place that turns failures into the error body of API.md.

Every non-2xx answer is ``{"error": {"type", "message", "request_id"}}``. Sources:

- :class:`~deskbox_server.errors.DeskboxError` (its ``kind`` and ``status``; ``Capacity``
  adds ``Retry-After``),
- FastAPI's ``RequestValidationError`` (bad JSON, wrong types, unknown fields) → 422,
- Starlette's ``HTTPException`` (unknown path 404, wrong method 405, ...),
- anything else → 500 ``internal`` (logged with its traceback, never shown to the client).

The one exception is :class:`~.disconnect.ClientLeft`: a bodiless 499 that no client reads
(it has disconnected), for the access log.

:class:`RequestContext` gives every request an id (``X-Request-Id`` header), bounds the body
size and the wait for each piece of it (408 ``timeout`` when a client stops sending: a stalled
upload must not hold its connection and the sandbox's writer forever), reads the rest of a
body that its answer came before (a 413) so that the connection does not close on it, and
is the last resort for unexpected exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import Capacity, DeskboxError, InvalidRequest, NotFound, Timeout, Unauthorized
from .disconnect import ClientLeft, client_left_response

__all__ = [
    "BodyTimeout",
    "PayloadTooLarge",
    "RequestContext",
    "allowed_methods",
    "current_request_id",
    "error_response",
    "install_error_handlers",
    "install_websocket_fallback",
    "validation_message",
]

log = logging.getLogger("deskbox.api")
access_log = logging.getLogger("deskbox.access")

# How long the rest of a body an answer came before is read for (RequestContext's
# send_after_body): past it, the connection is closed on whatever is still coming.
_DRAIN_MAX_S = 30.0
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

_KIND_BY_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    409: "conflict",
    413: "invalid_request",
    422: "invalid_request",
    429: "capacity",
    503: "capacity",
    504: "timeout",
}


_NOT_AN_OBJECT = {"dict_type", "model_type", "model_attributes_type"}
# The session a request is about: a field of its access line, to follow one session's calls.
_SESSION_PATH = re.compile(r"^/v1/sessions/(ses_[0-9A-Za-z]+)")
_UNPARSABLE = "There was an error parsing the body"  # FastAPI's 400 detail


class PayloadTooLarge(InvalidRequest):
    status = 413


class BodyTimeout(Timeout):
    """The client stopped sending its request body (a stalled or too slow upload)."""

    status = 408


def kind_of_status(status: int) -> str:
    """The error body's ``type`` for an HTTP status that no error of ours chose."""
    return _KIND_BY_STATUS.get(status, "invalid_request" if status < 500 else "internal")


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def current_request_id() -> str:
    """The id of the request being handled (set by :class:`RequestContext`)."""
    request_id = _request_id.get()
    if not request_id:
        request_id = new_request_id()
        _request_id.set(request_id)
    return request_id


ErrorCounter = Callable[[str], None]


def error_body(kind: str, message: str, request_id: str, action_index: int | None = None,
               ) -> dict[str, object]:
    """The ``error`` object of API.md's error body (schemas/errors.py)."""
    body: dict[str, object] = {"type": kind, "message": message, "request_id": request_id}
    if action_index is not None:
        body["action_index"] = action_index
    return body


def error_response(
    status: int,
    kind: str,
    message: str,
    headers: dict[str, str] | None = None,
    count: ErrorCounter | None = None,
    action_index: int | None = None,
) -> JSONResponse:
    request_id = current_request_id()
    if count is not None:
        count(kind)
    return JSONResponse(
        {"error": error_body(kind, message, request_id, action_index)},
        status_code=status,
        headers={**(headers or {}), "X-Request-Id": request_id},
    )


def deskbox_error_response(error: DeskboxError, count: ErrorCounter | None = None) -> JSONResponse:
    headers = {}
    if isinstance(error, Capacity):
        headers["Retry-After"] = str(error.retry_after_s)
    elif isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(error, BodyTimeout):
        # The connection cannot carry another request (its body was cut short) and the
        # client sends nothing: closed with the answer, not at uvicorn's keep-alive timeout
        # (5 s later). A body too large may still be arriving: closing on it would reset the
        # connection, and the client could lose the 413.
        headers["Connection"] = "close"
    return error_response(
        error.status, error.kind, error.message, headers, count, error.action_index)


def _location(loc: Sequence[int | str]) -> str:
    parts = [str(part) for part in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        where = parts[0]
        parts = parts[1:]
        return ".".join(parts) if parts else where
    return ".".join(parts)


def validation_message(errors: Iterable[Any], limit: int = 3) -> str:
    """A sentence out of pydantic's error list: the first few problems, where and what."""
    errors = list(errors)
    for error in errors:
        if error.get("type") == "json_invalid":
            detail = error.get("ctx", {}).get("error", "")
            return f"the request body is not valid JSON ({detail})" if detail else (
                "the request body is not valid JSON"
            )
    parts = []
    for error in errors:
        if tuple(error.get("loc", ())) == ("body",) and error.get("type") in _NOT_AN_OBJECT:
            return "the request body must be a JSON object (sent as application/json)"
    for error in errors[:limit]:
        where = _location(error.get("loc", ()))
        message = str(error.get("msg", "invalid"))
        parts.append(f"{where}: {message}" if where else message)
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return "invalid request: " + "; ".join(parts) + more if parts else "invalid request"


def allowed_methods(request: Request) -> list[str]:
    """Every method the API documents on this path (Starlette names only one route's).

    Read from the OpenAPI document: FastAPI's router nests included routers in private
    types, the document is public and lists each path's methods.
    """
    app = request.app
    assert isinstance(app, FastAPI)
    path = request.url.path
    methods: set[str] = set()
    for template, operations in app.openapi().get("paths", {}).items():
        pattern = "".join(
            "[^/]+" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{[^}]+\})", template)
        )
        if re.fullmatch(pattern, path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


_ANY_PATH = "/{path:path}"


def _takes_websocket(request: Request) -> bool:
    """Whether a websocket route other than the fallback has this path (asked through the
    routes' own matching: FastAPI nests included routers in private types)."""
    scope = {**request.scope, "type": "websocket"}
    return any(route.matches(scope)[0] is Match.FULL
               and not (isinstance(route, WebSocketRoute) and route.path == _ANY_PATH)
               for route in request.app.router.routes)


def install_websocket_fallback(app: FastAPI, count: ErrorCounter | None = None) -> None:
    """A websocket to no route (``/cdp/page/..%2F..%2Fjson``: the ``%2F`` is decoded before
    routing) is refused 404 with the error body; Starlette's was a 403 with none. Install
    it last: it matches every path."""

    @app.websocket(_ANY_PATH)
    async def no_such_websocket(websocket: WebSocket, path: str) -> None:
        error = NotFound(f"no websocket endpoint at /{path}")
        await websocket.send_denial_response(deskbox_error_response(error, count))


def install_error_handlers(app: FastAPI, count: ErrorCounter | None = None) -> None:
    async def on_deskbox_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, DeskboxError)
        if error.status >= 500:
            log.warning("%s: %s", error.kind, error.message)
        return deskbox_error_response(error, count)

    async def on_validation_error(_: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return error_response(422, "invalid_request", validation_message(error.errors()),
                              count=count)

    async def on_http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        if isinstance(error.__cause__, DeskboxError):
            # FastAPI wraps whatever reading the body raised, e.g. RequestContext's
            # PayloadTooLarge for a chunked body past the cap, into a 400.
            return deskbox_error_response(error.__cause__, count)
        status = error.status_code
        headers = dict(error.headers or {})
        if status == 400 and error.detail == _UNPARSABLE:
            # A body json.loads could not even decode (not UTF-8): bad JSON, like any other.
            status, message = 422, "the request body is not valid JSON (it must be UTF-8 text)"
        elif status == 404 and error.detail == "Not Found" and _takes_websocket(request):
            # What a reverse proxy that drops the Upgrade and Connection headers sends on.
            status, headers["Upgrade"] = 426, "websocket"
            message = ("this path takes a websocket, and the request came without "
                       "'Upgrade: websocket' (a proxy in front of the server must pass the "
                       "Upgrade and Connection headers on)")
        elif status == 404 and error.detail == "Not Found":
            message = "no such path"
        elif status == 405:
            message = "this method is not allowed on this path"
            headers["Allow"] = ", ".join(allowed_methods(request)) or headers.get("Allow", "")
        else:
            message = str(error.detail)
        return error_response(status, kind_of_status(status), message, headers, count)

    app.add_exception_handler(DeskboxError, on_deskbox_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    # Not an error: a client that left (disconnect.py), whose answer nobody reads.
    app.add_exception_handler(ClientLeft, client_left_response)


class RequestContext:
    """Pure ASGI middleware: request id, body size and idle caps, last-resort 500 answer."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        count: ErrorCounter | None = None,
        body_limit: Callable[[Scope], int | None] | None = None,
        body_idle_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_idle_timeout_s = body_idle_timeout_s
        self.count = count
        # A different cap for some requests (file uploads), or None for max_body_bytes.
        self.body_limit = body_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        _request_id.set(request_id)
        scope.setdefault("state", {})["request_id"] = request_id
        started = False
        began = time.monotonic()
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal started, status
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                started = True
                status = int(message.get("status", 0))
                headers = list(message.get("headers", []))
                if not any(name.lower() == b"x-request-id" for name, _ in headers):
                    headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self._serve(scope, receive, send_with_id, lambda: started)
        finally:
            # The path only: query strings can carry session tokens.
            path = scope.get("path", "")
            fields: dict[str, object] = {
                "request_id": request_id,
                "status": status,
                "duration_ms": round((time.monotonic() - began) * 1000, 2),
            }
            if session := _SESSION_PATH.match(path):
                fields["session_id"] = session[1]
            access_log.info(
                "%s %s %s",
                scope.get("method", "WS"),
                path,
                status or ("ws" if scope["type"] == "websocket" else 0),
                extra=fields,
            )

    async def _serve(
        self, scope: Scope, receive: Receive, send_with_id: Send, started: Callable[[], bool]
    ) -> None:
        if scope["type"] == "websocket":
            await self.app(scope, receive, send_with_id)
            return

        limit = self.body_limit(scope) if self.body_limit is not None else None
        max_body_bytes = self.max_body_bytes if limit is None else limit
        too_large = PayloadTooLarge(f"the request body is larger than {max_body_bytes} bytes")
        headers = dict(scope.get("headers", []))
        length = headers.get(b"content-length")
        received = 0
        body_done = length in (None, b"0") and b"transfer-encoding" not in headers
        # A client that waits for "100 Continue" sends its body only once it is asked for.
        asked = headers.get(b"expect", b"").lower() != b"100-continue"
        stalled = False
        idle_s = self.body_idle_timeout_s

        async def bounded_receive() -> Message:
            nonlocal received, body_done, asked
            asked = True
            if body_done:
                # After the body only the disconnect comes, however late (streamed answers).
                return await receive()
            try:
                async with asyncio.timeout(idle_s):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(
                    f"the request body stopped arriving (nothing for {idle_s:g} s)"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > max_body_bytes:
                    raise too_large
            else:
                body_done = True
            return message

        async def send_after_body(message: Message) -> None:
            """An answer that ends while its request's body still arrives (refused before it
            was read: a 413, a 401 on an upload) ends only once the rest of the body was read
            and dropped, for at most ``_DRAIN_MAX_S``. The answer's end is where uvicorn
            closes a connection the client asked to close (``Connection: close``, which
            nginx's usual proxy set-up sends on every request); closed on bytes still
            arriving, the socket is reset, the client's (or a proxy's) sending fails, and a
            proxy answers 502 in place of the answer. The client has the whole answer
            meanwhile: it carries its length."""
            nonlocal body_done, stalled
            if message["type"] == "http.response.start":
                # A 408 says the body stopped arriving: nothing to read on for.
                stalled = message["status"] == BodyTimeout.status
            if (message["type"] != "http.response.body" or message.get("more_body", False)
                    or body_done or not asked or stalled):
                await send_with_id(message)
                return
            await send_with_id({**message, "more_body": True})
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_DRAIN_MAX_S):
                    while not body_done:
                        rest = await receive()
                        body_done = rest["type"] != "http.request" or not rest.get("more_body")
            await send_with_id({"type": "http.response.body", "body": b""})

        if length is not None and length.isdigit() and int(length) > max_body_bytes:
            await deskbox_error_response(too_large, self.count)(scope, receive, send_after_body)
            return
        try:
            await self.app(scope, bounded_receive, send_after_body)
        except (PayloadTooLarge, BodyTimeout) as error:
            if started():
                raise
            await deskbox_error_response(error, self.count)(scope, receive, send_after_body)
        except ClientDisconnect:
            # The client left while its body was read (an aborted upload): nothing to
            # answer, and no fault of the server's to log or count.
            log.info("the client left during %s %s", scope.get("method"), scope.get("path"))
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if started():
                raise
            response = error_response(
                500, "internal", "the server failed to handle this request", count=self.count
            )
            await response(scope, receive, send_after_body)
