"""One worker thread per desktop: every X call of a desktop happens on its thread."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["DesktopWorker"]

P = ParamSpec("P")
T = TypeVar("T")


class DesktopWorker:
    """Runs blocking driver calls off the event loop, in order, on one dedicated thread."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"desktop-{name}")

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def call_sync(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """For synchronous callers (tests, benchmarks): same thread, same ordering."""
        return self._executor.submit(fn, *args, **kwargs).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
