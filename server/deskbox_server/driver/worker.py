"""One worker thread per desktop: every X call of a desktop happens on its thread.

A desktop's X server lives in a sandbox, and a sandbox can stop answering (its X server
stopped with SIGSTOP, or held by a client's server grab): a call blocked on it would never
return. So every call has a deadline, counted from when it starts running (a call queued
behind another waits for that one, which has its own). A call past its deadline *stalls*
the worker: it raises :class:`~deskbox_server.errors.DesktopFailed`, and so does every call
queued or made after it, at once. The stuck call returns only when its X server dies (the
caller kills the sandbox); :meth:`DesktopWorker.finish` then closes the driver on the
thread. The thread is a daemon: a stuck call never holds the server's exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar, cast

from ..errors import DesktopFailed

__all__ = ["CLOSE_TIMEOUT_S", "DEFAULT_CALL_TIMEOUT_S", "DesktopWorker"]

log = logging.getLogger("deskbox.driver")
P = ParamSpec("P")
T = TypeVar("T")
DEFAULT_CALL_TIMEOUT_S = 30.0
# How long closing the driver may wait once its desktop's processes are killed.
CLOSE_TIMEOUT_S = 5.0


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: concurrent.futures.Future[Any] = field(default_factory=concurrent.futures.Future)
    # Runs even on a stalled worker (closing the driver once the sandbox is dead).
    last: bool = False
    started_at: float | None = None  # monotonic; set on the worker thread


class DesktopWorker:
    """Runs blocking driver calls off the event loop, in order, on one dedicated thread.

    ``timeout_s``: how long a call may run (``call_within`` adds what the call itself may
    take, e.g. the waits of an action batch).
    """

    def __init__(self, name: str, timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._stalled: str | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"desktop-{name}", daemon=True)
        self._thread.start()

    @property
    def stalled(self) -> str | None:
        """Why the worker takes no more calls (a call did not return in time), or None."""
        return self._stalled

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        job = self._submit(functools.partial(fn, *args, **kwargs))
        return cast(T, await self._wait(job, self.timeout_s))

    async def call_within(
        self, extra_s: float, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Like :meth:`call`, for a call that may legitimately run ``extra_s`` longer."""
        job = self._submit(functools.partial(fn, *args, **kwargs))
        return cast(T, await self._wait(job, self.timeout_s + extra_s))

    def call_sync(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """For synchronous callers (tests, benchmarks): same thread, same ordering."""
        job = self._submit(functools.partial(fn, *args, **kwargs))
        while True:
            remaining = self._remaining(job, self.timeout_s)
            if remaining <= 0:
                raise self._stall(self.timeout_s)
            with_result, _ = concurrent.futures.wait([job.future], remaining)
            if with_result:
                return cast(T, job.future.result())

    async def finish(self, fn: Callable[[], object], timeout_s: float) -> bool:
        """Make ``fn`` the last call (closing the driver), even on a stalled worker, and let
        the thread end after it. Waits at most ``timeout_s`` (a stuck call ahead of it
        returns once its X server is dead); False if ``fn`` did not run in that time."""
        if self._closed:
            return True
        job = _Job(fn, last=True)
        self._closed = True
        self._jobs.put(job)
        self._jobs.put(None)
        waiter = asyncio.wrap_future(job.future)
        done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
        if done and waiter.exception() is not None:
            log.warning("closing a desktop: %r", waiter.exception())
        return bool(done)

    def shutdown(self) -> None:
        """Take no more calls; the thread ends after those queued. Never waits."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)

    # -- internals ------------------------------------------------------------------------

    def _submit(self, fn: Callable[[], Any]) -> _Job:
        if self._stalled is not None:
            raise DesktopFailed(self._stalled)
        if self._closed:
            raise DesktopFailed("the desktop has been stopped")
        job = _Job(fn)
        self._jobs.put(job)
        return job

    def _remaining(self, job: _Job, timeout_s: float) -> float:
        """Seconds left to ``job``'s deadline; a whole ``timeout_s`` while it is queued."""
        if self._stalled is not None and not job.future.done():
            return 0.0
        started = job.started_at
        if started is None:
            return timeout_s
        return started + timeout_s - time.monotonic()

    async def _wait(self, job: _Job, timeout_s: float) -> Any:
        waiter = asyncio.wrap_future(job.future)  # cancelling it cancels a queued job
        while True:
            remaining = self._remaining(job, timeout_s)
            if remaining <= 0 and job.future.done():  # returned just in time
                return job.future.result()
            if remaining <= 0:
                waiter.cancel()
                if self._stalled is not None and job.started_at is None:
                    raise DesktopFailed(self._stalled)
                raise self._stall(timeout_s)
            # Re-checked at least every second: a queued job's deadline starts when it does.
            try:
                done, _ = await asyncio.wait({waiter}, timeout=min(remaining, 1.0))
            except asyncio.CancelledError:
                waiter.cancel()  # a job still queued will not run
                raise
            if done:
                return waiter.result()

    def _stall(self, timeout_s: float) -> DesktopFailed:
        if self._stalled is None:
            self._stalled = (
                f"the desktop did not answer within {timeout_s:.1f} s (its X server is "
                "stopped or held by a grab)"
            )
            self._fail_queued()
        return DesktopFailed(self._stalled)

    def _fail_queued(self) -> None:
        """Jobs queued behind the stuck call fail now instead of waiting on it."""
        keep: list[_Job | None] = []
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None or job.last:
                keep.append(job)
            elif job.future.set_running_or_notify_cancel():
                job.future.set_exception(DesktopFailed(self._stalled or "stalled"))
        for job in keep:
            self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            if self._stalled is not None and not job.last:
                job.future.set_exception(DesktopFailed(self._stalled))
                continue
            job.started_at = time.monotonic()
            try:
                result = job.fn()
            except BaseException as error:  # noqa: BLE001 (handed to the caller)
                job.future.set_exception(error)
            else:
                job.future.set_result(result)
