"""Notices when a session's browser exits and when it answers again.

The sandbox's launcher restarts an exited browser (desktop_image/rootfs/usr/local/bin/
deskbox-session: same profile, growing delay). Here, one idle browser-level DevTools
connection per running session tells when that happened: the browser closes it (or the
socket resets) when it exits; reconnecting succeeds once the new browser listens. Each is
published as a session event (events.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from websockets.exceptions import ConnectionClosed

from ..agent.devtools import browser_path, open_websocket
from ..errors import DeskboxError
from .desktop import AnyDesktop
from .events import EventLog

__all__ = ["BrowserWatch"]

log = logging.getLogger("deskbox.sessions")
_FIRST_RETRY_S = 0.1
_MAX_RETRY_S = 0.5
_MAX_MESSAGE = 1024 * 1024  # it sends no command: the browser has nothing to tell it


class BrowserWatch:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, session_id: str, handle: AnyDesktop) -> None:
        if session_id not in self._tasks:
            self._tasks[session_id] = asyncio.create_task(
                self._follow(session_id, handle), name=f"deskbox-browser-{session_id}"
            )

    async def stop(self, session_id: str) -> None:
        task = self._tasks.pop(session_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, session_id: str, handle: AnyDesktop) -> None:
        restarts = 0
        exited = False
        retry_s = _FIRST_RETRY_S
        while True:
            try:
                path = await browser_path(handle.open_devtools)
                connection = await open_websocket(handle.open_devtools, path, _MAX_MESSAGE)
            except DeskboxError:
                await asyncio.sleep(retry_s)
                retry_s = min(_MAX_RETRY_S, retry_s * 2)
                continue
            except Exception:
                log.exception("watching the browser of session %s", session_id)
                return
            retry_s = _FIRST_RETRY_S
            if exited:
                restarts += 1
                log.info("session %s: the browser answers again (restart %d)",
                         session_id, restarts)
                self._events.publish(session_id, "browser_restarted", browser_restarts=restarts)
            try:
                async for _ in connection:  # nothing is expected; read to notice the close
                    pass
            except ConnectionClosed:
                pass
            except asyncio.CancelledError:
                # The session pauses or ends: no closing handshake to wait for, with a
                # browser that may be frozen next and a pause that waits for this.
                connection.transport.abort()
                raise
            finally:
                await connection.close()
            exited = True
            log.warning("session %s: the browser exited", session_id)
            self._events.publish(session_id, "browser_exited",
                                 reason="the browser closed its DevTools connection")
