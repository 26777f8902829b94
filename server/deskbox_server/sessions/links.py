"""Client connections that lead into a session's sandbox from the host: VNC viewers and
proxied DevTools sockets.

CRIU cannot checkpoint a sandbox while a host process holds a connection into it, so before
a hibernate, snapshot or fork the session layer closes them (:meth:`SessionLinks.close`);
their clients see the websocket close with code 1012 ("service restart") and may reconnect
once the session runs again. While a session is being checkpointed, new ones are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from ..errors import Conflict

__all__ = ["RESTART_CLOSE_CODE", "Link", "SessionLinks", "checkpointing"]

log = logging.getLogger("deskbox.sessions")
RESTART_CLOSE_CODE = 1012
_CLOSE_TIMEOUT_S = 5.0


def checkpointing(session_id: str) -> Conflict:
    return Conflict(f"session {session_id} is being checkpointed; connect again in a moment")


@dataclass
class Link:
    close: Callable[[], Awaitable[None]]
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    # Set before ``close`` is called: a connection still being made when a checkpoint
    # begins has nothing for ``close`` to close yet, and must give up once it is made.
    closing: bool = False


class SessionLinks:
    def __init__(self) -> None:
        self._links: dict[str, dict[int, Link]] = {}
        self._closed: set[str] = set()  # sessions being checkpointed
        self._ids = itertools.count()

    def count(self, session_id: str) -> int:
        return len(self._links.get(session_id, {}))

    @contextlib.asynccontextmanager
    async def hold(
        self, session_id: str, close: Callable[[], Awaitable[None]]
    ) -> AsyncIterator[Link]:
        """Register one connection for its lifetime; ``close`` ends it from outside.

        The connection counts as gone only when this context exits: put everything that
        holds the connection open (and cleans up after it) inside. A connection made
        inside must check :attr:`Link.closing` once it is made.
        """
        if session_id in self._closed:
            raise checkpointing(session_id)
        key = next(self._ids)
        link = Link(close)
        self._links.setdefault(session_id, {})[key] = link
        try:
            yield link
        finally:
            link.gone.set()
            links = self._links.get(session_id, {})
            links.pop(key, None)
            if not links:
                self._links.pop(session_id, None)

    @contextlib.asynccontextmanager
    async def closed(self, session_id: str) -> AsyncIterator[None]:
        """Close every connection of the session and refuse new ones while inside.

        Returns once they are all gone (or after a few seconds, logged: the checkpoint then
        names the connection still open).
        """
        self._closed.add(session_id)
        try:
            links = list(self._links.get(session_id, {}).values())
            if links:
                log.info("session %s: closing %d client connections for a checkpoint",
                         session_id, len(links))
                for link in links:
                    link.closing = True
                await asyncio.gather(*(link.close() for link in links),
                                     return_exceptions=True)
                waits = [asyncio.create_task(link.gone.wait()) for link in links]
                _, pending = await asyncio.wait(waits, timeout=_CLOSE_TIMEOUT_S)
                for task in pending:
                    task.cancel()
                if pending:
                    log.warning("session %s: %d connections did not close in %g s",
                                session_id, len(pending), _CLOSE_TIMEOUT_S)
            yield
        finally:
            self._closed.discard(session_id)
