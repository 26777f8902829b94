"""Waiting on a file descriptor from the event loop, without a thread."""

from __future__ import annotations

import asyncio

__all__ = ["wait_readable"]


async def wait_readable(fd: int) -> None:
    """Until ``fd`` can be read (an X server answered, a pidfd's process exited)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)
