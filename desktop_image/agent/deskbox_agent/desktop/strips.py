"""A frame's encode on several CPUs: the frame is cut into horizontal strips, each encoded
on its own thread, and the format joins them into one image (jpeg_strips.py, encode.py's
PNG).

libjpeg-turbo and ISA-L each encode on one thread and let go of the GIL while they do, and
a screenshot waits for its encode: on bench/agent_desktop.py's 1280x800 page of text a JPEG
took 2.6-3.0 ms, a PNG 2.8 ms, most of a look's time in the agent. With the sandbox's CPUs
(2 here) at work on it, 1.5-2.1 and 1.6-1.7 ms, for the same CPU time (bench/README.md).
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_THREADS", "MIN_PIXELS", "Strips", "cut", "strip_starts"]

T = TypeVar("T")
A = TypeVar("A")

# Below this, the hand-off to another thread costs about what it saves.
MIN_PIXELS = 256 * 1024
MAX_THREADS = 4
_PIECES_PER_THREAD = 2


def strip_starts(width: int, height: int, count: int, unit: int = 1) -> list[int]:
    """The first row of each of at most ``count`` strips of whole ``unit`` rows (the last
    may be shorter); ``[0]`` (the frame whole) for one strip or a small frame."""
    units = -(-height // unit)
    per_strip = -(-units // max(1, count))
    if count < 2 or width * height < MIN_PIXELS or units < 2:
        return [0]
    return list(range(0, height, per_strip * unit))


def cut(pixels: npt.NDArray[np.uint8], starts: list[int]) -> list[npt.NDArray[np.uint8]]:
    """The frame's rows in strips, each from its start to the next one's (views)."""
    ends = [*starts[1:], int(pixels.shape[0])]
    return [pixels[top:bottom] for top, bottom in zip(starts, ends, strict=True)]


class Strips:
    """This thread and ``count - 1`` helpers (started by the first frame cut). One caller at
    a time: the desktop's worker."""

    def __init__(self, count: int | None = None) -> None:
        if count is None:
            count = min(len(os.sched_getaffinity(0)), MAX_THREADS)
        self.count = max(1, count)
        self._helpers: concurrent.futures.ThreadPoolExecutor | None = None
        self.frames_cut = 0  # frames encoded in strips (for tests and benchmarks)

    @property
    def pieces(self) -> int:
        """Strips to cut a frame into: more than threads, so that one thread without a CPU
        for a while holds up at most a small piece (see :meth:`map`)."""
        return 1 if self.count < 2 else self.count * _PIECES_PER_THREAD

    def map(self, work: Callable[[A], T], pieces: Sequence[A]) -> list[T]:
        """``work`` of each piece, in order: the first on this thread, the others on the
        helpers meanwhile; then this thread takes, from the last one back, every piece no
        helper has started (on a busy host a helper may wait for a CPU: the frame is then
        encoded about as fast as on one thread, not slower)."""
        if len(pieces) < 2:
            return [work(piece) for piece in pieces]
        if self._helpers is None:
            self._helpers = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.count - 1, thread_name_prefix="encode")
        later = [self._helpers.submit(work, piece) for piece in pieces[1:]]
        done: dict[int, T] = {}
        try:
            done[0] = work(pieces[0])
            for index in range(len(later), 0, -1):
                if later[index - 1].cancel():
                    done[index] = work(pieces[index])
        finally:
            # After an error no piece is needed; and never return (or raise) while a
            # helper still reads the caller's frame.
            for future in later:
                future.cancel()
            concurrent.futures.wait(later)
        self.frames_cut += 1
        return [done[index] if index in done else later[index - 1].result()
                for index in range(len(pieces))]

    def close(self) -> None:
        if self._helpers is not None:
            self._helpers.shutdown(wait=False, cancel_futures=True)
            self._helpers = None
