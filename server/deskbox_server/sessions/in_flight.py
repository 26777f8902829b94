"""State changes that run to their end once begun, whoever stops waiting for them.

A hibernate, a resume or a snapshot cut short leaves a sandbox half checkpointed or half
restored, and its work goes on in a thread the cancellation does not reach. Their callers
are requests: a client hangs up, and the server's stop cancels the requests still running
after ``shutdown_grace_s``. So each change runs as a task of its own that the request only
awaits, and the server's stop waits for those tasks before it lets go of the sessions: a
hibernate that outlasts the grace still ends with the session on disk for the next server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ChangesInFlight"]

log = logging.getLogger("deskbox.sessions")
T = TypeVar("T")


class ChangesInFlight:
    """The state changes running now (one set per manager)."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()  # each named for what it does

    async def run(self, change: Coroutine[Any, Any, T], what: str) -> T:
        """``change``'s result; it goes on if the caller is cancelled meanwhile."""
        task = asyncio.create_task(change, name=what)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():
                log.info("%s goes on without its caller", what)
                task.add_done_callback(_told_nobody)
            raise

    async def wait(self, timeout_s: float) -> None:
        """Until every change running now has ended, or ``timeout_s``."""
        if not self._running:
            return
        log.info("waiting up to %g s for %s", timeout_s,
                 ", ".join(task.get_name() for task in self._running))
        _, pending = await asyncio.wait(set(self._running), timeout=timeout_s)
        for task in pending:
            log.warning("%s did not end within %g s of the server's stop", task.get_name(),
                        timeout_s)


def _told_nobody(task: asyncio.Task[Any]) -> None:
    """The end of a change whose caller left: the log is the only one to hear of it."""
    if task.cancelled():
        log.warning("%s was cancelled", task.get_name())
    elif (error := task.exception()) is not None:
        log.warning("%s failed: %s", task.get_name(), error)
    else:
        log.info("%s done", task.get_name())
