"""Pipe ends we own, read and written on the event loop without blocking it.

asyncio's subprocess streams close their pipes only when the child's side closes, and a
process inside a sandbox can keep a copy of its stdout open for as long as it likes. With
the read end in our hands, we stop reading when *we* decide (the command exited, its
timeout passed) and close it: nothing of ours waits on the sandbox.
"""

from __future__ import annotations

import asyncio
import os

__all__ = ["CappedBuffer", "PipeReader", "PipeWriter", "pipe"]

CHUNK = 1 << 16


def pipe() -> tuple[int, int]:
    """A close-on-exec pipe (read end, write end); pass the one the child gets explicitly."""
    return os.pipe2(os.O_CLOEXEC)


class _Fd:
    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self.fd: int | None = fd

    def _open_fd(self) -> int:
        if self.fd is None:
            raise ValueError("the pipe is closed")
        return self.fd

    async def _ready(self, writer: bool) -> None:
        fd = self._open_fd()
        loop = asyncio.get_running_loop()
        ready = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        (loop.add_writer if writer else loop.add_reader)(fd, wake)
        try:
            await ready
        finally:
            (loop.remove_writer if writer else loop.remove_reader)(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class PipeReader(_Fd):
    async def read(self, size: int = CHUNK) -> bytes:
        """Up to ``size`` bytes; b"" at end of file."""
        while True:
            try:
                return os.read(self._open_fd(), size)
            except BlockingIOError:
                await self._ready(writer=False)


class PipeWriter(_Fd):
    async def write(self, data: bytes | memoryview) -> None:
        """All of ``data``; raises BrokenPipeError once the reader is gone."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._open_fd(), view)
            except BlockingIOError:
                await self._ready(writer=True)
                continue
            view = view[written:]


class CappedBuffer:
    """Keeps the first ``limit`` bytes of a stream, counts the rest, drops it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._data = bytearray()
        self.dropped = 0

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self._data)
        if room > 0:
            self._data += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    async def drain(self, reader: PipeReader) -> None:
        """Read ``reader`` to its end (cancel to stop early; what came so far is kept)."""
        while chunk := await reader.read():
            self.feed(chunk)

    def value(self) -> bytes:
        return bytes(self._data)
