"""Aborting a websocket's connection, for clients that stopped reading.

Closing a connection does not free what waits in its write buffer: asyncio's transport
closes the socket only once the buffer is written, which for a client that never reads
is never. A relay that drops such a client (cdp_relay.py) aborts the connection instead.

ASGI has no message for that, so :class:`ConnectionAbort`, the outermost middleware, keeps
a way to reach the server's transport in the scope's state: uvicorn's ``send`` is a method
of its protocol, which has the transport. With another server the abort does nothing,
and the buffer is freed when the client goes away.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["ConnectionAbort", "abort_connection"]

_STATE_KEY = "abort_connection"


def _aborter(send: Send) -> Callable[[], None] | None:
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    # Known by what it does: uvloop's transports (what `deskbox serve` runs) are not
    # asyncio.BaseTransport subclasses, and an isinstance check made every abort a no-op.
    abort = getattr(transport, "abort", None)
    return abort if callable(abort) else None


class ConnectionAbort:
    """Pure ASGI middleware: websocket scopes get the abort of their connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            abort = _aborter(send)
            if abort is not None:
                scope.setdefault("state", {})[_STATE_KEY] = abort
        await self.app(scope, receive, send)


def abort_connection(connection: HTTPConnection) -> bool:
    """Abort ``connection`` now, dropping what waits to be written; False if unable."""
    abort = connection.scope.get("state", {}).get(_STATE_KEY)
    if abort is None:
        return False
    abort()
    return True
