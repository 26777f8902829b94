"""Aborting a connection, for clients that stopped reading or answers that must end cut,
and how much a websocket's write buffer holds.

Closing a connection does not free what waits in its write buffer: asyncio's transport
closes the socket only once the buffer is written, which for a client that never reads
is never. A relay that drops such a client (cdp_relay.py) aborts the connection instead.
The relay also asks how much of what it wrote still waits there: what has left the
buffer the client has taken (or the kernel holds), and it is the relay's no longer. A
download whose head is sent and that cannot go on (exec.py) is aborted too: the client
then sees it cut, where an answer that ended would read as whole.

ASGI has no message for either, so ways to reach the server's transport are kept in the
scope's state: for a websocket by :class:`ConnectionAbort`, the outermost middleware
(uvicorn's ``send`` is a method of its protocol, which has the transport), for an HTTP
request by our HTTP protocol (http_protocol.py; Starlette wraps an HTTP request's send
before any middleware of ours). With another server the abort does nothing, and the
buffer is freed when the client goes away; and what was written counts as waiting until
the next message is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ABORT_STATE_KEY", "ConnectionAbort", "abort_connection", "unsent_bytes"]

ABORT_STATE_KEY = "abort_connection"
_UNSENT_KEY = "unsent_bytes"


def _transport_method(send: Send, name: str) -> Callable[[], Any] | None:
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    # Known by what it does: uvloop's transports (what `deskbox serve` runs) are not
    # asyncio.BaseTransport subclasses, and an isinstance check made every abort a no-op.
    method = getattr(transport, name, None)
    return method if callable(method) else None


class ConnectionAbort:
    """Pure ASGI middleware: websocket scopes get the abort of their connection, and the
    size of its write buffer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            state = scope.setdefault("state", {})
            for key, name in ((ABORT_STATE_KEY, "abort"),
                              (_UNSENT_KEY, "get_write_buffer_size")):
                found = _transport_method(send, name)
                if found is not None:
                    state[key] = found
        await self.app(scope, receive, send)


def abort_connection(connection: HTTPConnection) -> bool:
    """Abort ``connection`` now, dropping what waits to be written; False if unable."""
    abort = connection.scope.get("state", {}).get(ABORT_STATE_KEY)
    if abort is None:
        return False
    abort()
    return True


def unsent_bytes(connection: HTTPConnection) -> Callable[[], int] | None:
    """How many bytes ``connection``'s write buffer holds, asked when called; None if
    unknown."""
    unsent: Callable[[], int] | None = connection.scope.get("state", {}).get(_UNSENT_KEY)
    return unsent
