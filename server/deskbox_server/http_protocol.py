"""uvicorn's HTTP/1.1 protocol (h11) with what it lacks for a server on an open port.

- **A deadline on each request's head.** uvicorn bounds the quiet between requests (its
  keep-alive timeout, reset by any byte), but neither a connection that sends nothing nor
  the time a head takes once its first byte came (uvicorn issue #157): a client could hold
  any number of connections open for ever by sending a header line now and then
  (slowloris). The body has its own bound (api/errors.py, ``body_idle_timeout_s``).
- **A way to abort the connection** in each request's scope state (api/abort.py): a
  download that cannot go on once its head is sent ends with its connection cut.
- **Our error body for a request that is not HTTP/1.1** (a garbled request line or header,
  two Content-Lengths, a broken chunk): uvicorn answers those with a text/plain "Invalid
  HTTP request received."; every other 4xx of ours is the JSON error body (API.md).

And for the websocket protocol uvicorn switches to on an ``Upgrade: websocket`` request:
**our error body for a handshake that fails** before the app sees it (no or a malformed
``Sec-WebSocket-Key``, a version other than 13, a method other than GET), which the
websockets library answers in text/plain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.datastructures import Headers
from websockets.http11 import Response

from .api.abort import ABORT_STATE_KEY
from .api.errors import kind_of_status, new_request_id

__all__ = ["DeskboxWebSocket", "deskbox_http_protocol"]

log = logging.getLogger("deskbox.http")

_LIBRARY_PREFIX = "Failed to open a WebSocket connection"
_NOT_HTTP = ("the request is not valid HTTP/1.1 (its request line, a header, or the framing "
             "of its body)")


def deskbox_http_protocol(
    head_timeout_s: float, on_head_overdue: Callable[[], None] = lambda: None
) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http``: a connection that has not sent a whole
    request head ``head_timeout_s`` after it opened, or after the answer to its last
    request, is closed (``on_head_overdue`` is called for each)."""

    class DeskboxHttp(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # Each request's scope state is a copy of this: it carries the connection's
            # abort, for an answer that must end cut (api/abort.py), which the app cannot
            # reach through a send the middleware of an HTTP request wraps.
            self.app_state = {**self.app_state, ABORT_STATE_KEY: transport.abort}
            self._await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            request_id, body = _error_body(400, _NOT_HTTP)
            headers = [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()),
                       (b"x-request-id", request_id.encode()), (b"connection", b"close")]
            try:
                for event in (h11.Response(status_code=400, headers=headers,
                                           reason=b"Bad Request"),
                              h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event) or b"")
            except h11.LocalProtocolError:
                pass  # an answer had begun already: the connection's end says it
            self.transport.close()

        def _waiting_for_head(self) -> bool:
            # h11's IDLE: before a request's head is whole. After it the state is the body's,
            # DONE, or a websocket upgrade's (the transport then belongs to that protocol).
            return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def _await_head(self) -> None:
            """The timer runs from when the connection began waiting for a head."""
            if not self._waiting_for_head():
                self._stop_head_timer()
            elif self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout_s, self._head_overdue)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_overdue(self) -> None:
            self._head_timer = None
            if self._waiting_for_head():
                log.info("closed a connection from %s: no whole request head within %g s",
                         self.client[0] if self.client else "?", head_timeout_s)
                on_head_overdue()
                self.transport.close()

    return DeskboxHttp


class DeskboxWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's websocket protocol (websockets' sans-I/O one) whose refusals before the app
    (a handshake it cannot accept, or the app's failure then) carry our error body."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn builds the ServerProtocol itself; every refusal of a handshake goes through
        # its ``reject`` (the library's own and uvicorn's 403 and 500).
        setattr(self.conn, "reject", _json_reject)  # noqa: B010 (mypy: a method is read-only)


def _json_reject(status: int, text: str) -> Response:
    # The library's text reads "Failed to open a WebSocket connection: <why>.\n\n<advice>";
    # uvicorn's own refusals (403, 500) say nothing or only the status's phrase.
    why = text.split("\n")[0].removeprefix(_LIBRARY_PREFIX).strip(":. ")
    status = int(status)  # the library passes HTTPStatus members
    phrase = HTTPStatus(status).phrase
    request_id, body = _error_body(status, f"the websocket handshake failed: {why or phrase}")
    headers = Headers([("Connection", "close"), ("Content-Type", "application/json"),
                       ("Content-Length", str(len(body))), ("X-Request-Id", request_id)])
    return Response(status, phrase, headers, body)


def _error_body(status: int, message: str) -> tuple[str, bytes]:
    """A new request id and the error body (API.md) naming it, for an answer made here,
    before a request reaches the app."""
    request_id = new_request_id()
    error = {"type": kind_of_status(status), "message": message, "request_id": request_id}
    return request_id, json.dumps({"error": error}, separators=(",", ":")).encode()
