"""A sandbox made in a thread (runc's start and restore, the local engine's processes),
or by a call to a daemon (a container's create), awaited so that a cancelled create leaves
nothing behind.

Cancelling the await does not stop the thread: its sandbox comes into being all the same,
after the caller has gone (a DELETE of a starting session, a shutdown that stops waiting).
It is then stopped as soon as it is there, instead of running on unowned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["answered", "made_in_thread"]

log = logging.getLogger("deskbox.engines")
T = TypeVar("T")


async def made_in_thread(make: Callable[[], T], stop: Callable[[T], None]) -> T:
    """``make()`` run in a thread; if the caller is cancelled meanwhile, ``stop(made)``
    (in a thread too) once it returns."""
    making = asyncio.ensure_future(asyncio.to_thread(make))
    try:
        return await asyncio.shield(making)
    except asyncio.CancelledError:
        making.add_done_callback(lambda done: _stop_unwanted(done, stop))
        raise


def _stop_unwanted(done: asyncio.Future[T], stop: Callable[[T], None]) -> None:
    if not done.cancelled() and done.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, _stop, stop, done.result())


def _stop(stop: Callable[[T], None], made: T) -> None:
    try:
        stop(made)
    except Exception:  # noqa: BLE001 (nobody waits for it: said here, or never)
        log.exception("stopping a sandbox whose create was cancelled")


async def answered(call: Awaitable[T]) -> T:
    """The answer to a request that makes something elsewhere (a container of a daemon,
    an object of the Kubernetes API).

    Cancelling the request does not undo it: the daemon goes on and makes the thing after
    the caller has stopped waiting, and a clean-up that removed it by name before then
    found nothing. Cancelled, this waits for the answer all the same (the call is bounded
    by its own timeout), so that the caller's clean-up finds what was made, then re-raises.
    """
    request = asyncio.ensure_future(call)
    try:
        return await asyncio.shield(request)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await request
        raise
