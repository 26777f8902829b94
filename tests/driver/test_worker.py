"""Every call of a desktop runs on its one worker thread, in the order it was made."""

from __future__ import annotations

import asyncio
import threading

from deskbox_server.driver.worker import DesktopWorker


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
