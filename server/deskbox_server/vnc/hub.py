"""One VNC server per session, started for the first viewer and stopped after the last."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from ..agent.vnc_server import VncServer
from ..errors import Capacity

__all__ = ["MAX_VIEWERS_PER_SESSION", "VncHub"]

# Each viewer holds a stream of the session's agent connection (at most 128, shared with
# commands, files and DevTools) and up to a viewer's buffer of memory: one view token
# opening viewers without end once starved everything else of the session.
MAX_VIEWERS_PER_SESSION = 32

log = logging.getLogger("deskbox.vnc")


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    server: VncServer | None = None
    viewers: int = 0


class VncHub:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def viewers(self, session_id: str) -> int:
        entry = self._entries.get(session_id)
        return entry.viewers if entry is not None else 0

    def server(self, session_id: str) -> VncServer | None:
        entry = self._entries.get(session_id)
        return entry.server if entry is not None else None

    @contextlib.asynccontextmanager
    async def viewer(
        self, session_id: str, start: Callable[[], Awaitable[VncServer]],
        retry_after_s: int = 5,
    ) -> AsyncIterator[VncServer]:
        """The session's server (started with ``start`` if none runs) for one viewer;
        Capacity (429) past MAX_VIEWERS_PER_SESSION."""
        entry = self._entries.setdefault(session_id, _Entry())
        if entry.viewers >= MAX_VIEWERS_PER_SESSION:
            raise Capacity(f"session {session_id} has {MAX_VIEWERS_PER_SESSION} live viewers; "
                           "close one first", retry_after_s)
        entry.viewers += 1
        try:
            async with entry.lock:
                self._entries.setdefault(session_id, entry)
                if entry.server is not None and entry.server.failure() is not None:
                    log.info("session %s: VNC server gone (%s); restarting it",
                             session_id, entry.server.failure())
                    await entry.server.stop()
                    entry.server = None
                if entry.server is None:
                    entry.server = await start()
                    log.info("session %s: VNC server started", session_id)
                server = entry.server
            yield server
        finally:
            entry.viewers -= 1
            if entry.viewers == 0:
                await asyncio.shield(self._stop_idle(session_id, entry))

    async def _stop_idle(self, session_id: str, entry: _Entry) -> None:
        async with entry.lock:
            if entry.viewers:  # someone joined meanwhile
                return
            server = entry.server
            if server is not None:
                try:
                    await server.stop()
                except Exception:
                    log.exception("session %s: stopping the VNC server", session_id)
                log.info("session %s: last viewer left; VNC server stopped", session_id)
            entry.server = None
            if self._entries.get(session_id) is entry:
                del self._entries[session_id]

    async def close(self) -> None:
        """Stop every server (server shutdown)."""
        entries, self._entries = self._entries, {}
        for entry in entries.values():
            if entry.server is not None:
                with contextlib.suppress(Exception):
                    await entry.server.stop()
                entry.server = None
