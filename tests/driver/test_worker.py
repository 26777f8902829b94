"""Every call of a desktop runs on its one worker thread, in the order it was made, and
within a deadline: a call that does not return stalls the worker (issue 13)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from deskbox_server.driver.worker import DesktopWorker
from deskbox_server.errors import DesktopFailed


async def test_calls_run_in_order_on_one_thread() -> None:
    worker = DesktopWorker("t")
    seen: list[tuple[int, int]] = []

    def record(index: int) -> int:
        seen.append((index, threading.get_ident()))
        return index * 2

    try:
        results = await asyncio.gather(*(worker.call(record, i) for i in range(50)))
    finally:
        worker.shutdown()
    assert results == [i * 2 for i in range(50)]
    assert [index for index, _ in seen] == list(range(50))
    assert len({thread for _, thread in seen}) == 1
    assert seen[0][1] != threading.get_ident()


async def test_a_call_past_its_deadline_stalls_the_worker_and_fails_what_waits() -> None:
    worker = DesktopWorker("t", timeout_s=0.3)
    release = threading.Event()
    try:
        stuck = asyncio.ensure_future(worker.call(release.wait))
        queued = asyncio.ensure_future(worker.call(lambda: "never"))
        started = time.monotonic()
        with pytest.raises(DesktopFailed, match="did not answer within 0.3 s"):
            await stuck
        with pytest.raises(DesktopFailed, match="did not answer"):
            await queued
        assert time.monotonic() - started < 1.5
        assert worker.stalled is not None
        with pytest.raises(DesktopFailed, match="did not answer"):
            await worker.call(lambda: "later")  # at once, not queued behind the stuck call
        closed: list[bool] = []
        finishing = asyncio.ensure_future(worker.finish(lambda: closed.append(True), 5.0))
        await asyncio.sleep(0.1)
        assert not closed  # the last call waits for the stuck one (its X server to die)
        release.set()
        assert await finishing and closed
    finally:
        release.set()
        worker.shutdown()


async def test_the_deadline_counts_from_when_a_call_starts_not_while_it_is_queued() -> None:
    worker = DesktopWorker("t", timeout_s=0.3)
    try:
        long = worker.call_within(0.5, time.sleep, 0.6)  # allowed 0.8 s
        after = worker.call(lambda: "ran")  # queued 0.6 s, then quick
        assert await asyncio.gather(long, after) == [None, "ran"]
        assert worker.stalled is None
    finally:
        worker.shutdown()


async def test_finish_gives_up_on_a_call_that_never_returns() -> None:
    worker = DesktopWorker("t", timeout_s=0.2)
    release = threading.Event()
    try:
        with pytest.raises(DesktopFailed):
            await worker.call(release.wait)
        started = time.monotonic()
        assert not await worker.finish(lambda: None, 0.3)
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
