"""The host takes an agent's deflated frame only if it is exactly what it must be
(server/deskbox_server/agent/inflate.py): libdeflate in one call, or isal_zlib's streaming
inflater where libdeflate is missing. Both refuse the same streams, and neither makes
much more than the frame's size of a stream that would inflate to more."""

from __future__ import annotations

import tracemalloc
import zlib
from collections.abc import Callable

import numpy as np
import pytest

from deskbox_agent.desktop.encode import deflate_frame
from deskbox_agent.desktop.strips import Strips
from deskbox_server.agent.inflate import inflate_exact, inflate_streaming, libdeflate

Inflate = Callable[[bytes, int], bytes | bytearray | None]
INFLATERS = [pytest.param(inflate_exact, id="libdeflate"),
             pytest.param(inflate_streaming, id="isal")]


def _frame_bytes(width: int = 640, height: int = 480) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (height, width, 4), dtype=np.uint8)
    pixels[: height // 2] = (20, 40, 60, 0)  # half flat, half noise
    return pixels.tobytes()


def test_the_host_has_libdeflate() -> None:
    # scripts/setup.sh installs it: the suite runs the path a server takes.
    assert libdeflate() is not None


@pytest.mark.parametrize("inflate", INFLATERS)
def test_a_whole_stream_of_the_size_is_inflated(inflate: Inflate) -> None:
    raw = _frame_bytes()
    out = inflate(zlib.compress(raw, 1), len(raw))
    assert out is not None and bytes(out) == raw


@pytest.mark.parametrize("inflate", INFLATERS)
def test_a_frame_the_agent_deflated_in_strips_is_inflated(inflate: Inflate) -> None:
    pixels = np.frombuffer(_frame_bytes(1280, 800), np.uint8).reshape(800, 1280, 4)
    strips = Strips(2)
    try:
        data = deflate_frame(pixels, strips)
    finally:
        strips.close()
    assert strips.frames_cut == 1
    out = inflate(data, pixels.nbytes)
    assert out is not None and bytes(out) == pixels.tobytes()


@pytest.mark.parametrize("inflate", INFLATERS)
@pytest.mark.parametrize("bad", [
    "one byte short", "one byte more", "bytes after the stream", "wrong Adler-32",
    "cut short", "raw deflate without the zlib header", "nothing", "not deflate"])
def test_anything_else_is_refused(inflate: Inflate, bad: str) -> None:
    raw = _frame_bytes()
    good = zlib.compress(raw, 1)
    data = {
        "one byte short": zlib.compress(raw[:-1], 1),
        "one byte more": zlib.compress(raw + b"\0", 1),
        "bytes after the stream": good + b"\0",
        "wrong Adler-32": good[:-1] + bytes([good[-1] ^ 1]),
        "cut short": good[:-10],
        "raw deflate without the zlib header": good[2:-4],
        "nothing": b"",
        "not deflate": b"\xff" * 1000,
    }[bad]
    assert inflate(data, len(raw)) is None


@pytest.mark.parametrize("inflate", INFLATERS)
def test_a_stream_that_inflates_to_far_more_makes_no_more_than_the_size(
    inflate: Inflate,
) -> None:
    size = 4 * 1024 * 1024
    bomb = zlib.compress(bytes(64 * size), 9)  # 256 MiB of zeros in ~250 KiB
    tracemalloc.start()
    try:
        assert inflate(bomb, size) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * size
