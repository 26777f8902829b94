"""A look encoded in strips on several threads is one valid image with exactly the pixels of
a single encode (desktop_image/agent/deskbox_agent/desktop/strips.py, jpeg_strips.py and
encode.py's PNG), and a pause's frame deflated in strips is one zlib stream of its bytes."""

from __future__ import annotations

import io
import random
import struct
import threading
import zlib
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt
import pytest
from PIL import Image

from deskbox_agent.desktop.encode import adler32_combine, deflate_frame, encode, encode_png
from deskbox_agent.desktop.frame import Frame
from deskbox_agent.desktop.jpeg_strips import encode_jpeg, join_strips, jpeg_strip_starts
from deskbox_agent.desktop.strips import Strips, strip_starts

MakeStrips = Callable[[int], Strips]
SIZES = [(1280, 800, 2), (1280, 800, 3), (1281, 801, 2), (1366, 768, 4), (640, 410, 2),
         (333, 2000, 3), (1920, 1080, 4)]


def _frame(width: int, height: int, seed: int = 1) -> npt.NDArray[np.uint8]:
    """Noise (the worst case for both coders), a flat band and a sharp edge that crosses
    where strips meet."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 4), dtype=np.uint8)
    pixels[height // 3: height // 2] = (40, 90, 200, 0)
    pixels[:, width // 2:, 1] = 255
    return pixels


def _decoded(data: bytes, kind: str) -> npt.NDArray[np.uint8]:
    with Image.open(io.BytesIO(data)) as image:
        assert image.format == kind
        return np.asarray(image.convert("RGB"))


def _markers(data: bytes, first: int, last: int) -> int:
    """Markers 0xFFfirst..0xFFlast in a JPEG (entropy-coded 0xFF bytes are stuffed)."""
    return sum(data.count(bytes((0xFF, code))) for code in range(first, last + 1))


@pytest.fixture
def make_strips() -> Iterator[MakeStrips]:
    """``Strips`` of a given thread count, their helper threads ended after the test."""
    made: list[Strips] = []

    def make(count: int) -> Strips:
        made.append(Strips(count))
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.mark.parametrize(("width", "height", "count"), SIZES)
def test_a_jpeg_in_strips_decodes_to_the_pixels_of_one_encode(
    width: int, height: int, count: int, make_strips: MakeStrips,
) -> None:
    pixels = _frame(width, height)
    strips = make_strips(count)
    joined = encode(Frame(pixels), "jpeg", 75, strips).data
    whole = encode(Frame(pixels), "jpeg", 75).data
    assert strips.frames_cut == 1
    cuts = len(jpeg_strip_starts(width, height, strips.pieces)) - 1
    assert cuts >= count
    assert _markers(joined, 0xD0, 0xD7) == cuts  # RSTn between strips
    assert _markers(joined, 0xDD, 0xDD) == 1  # one DRI
    assert _markers(whole, 0xD0, 0xD7) == 0
    decoded = _decoded(joined, "JPEG")
    assert decoded.shape == (height, width, 3)
    assert np.array_equal(decoded, _decoded(whole, "JPEG"))
    assert abs(len(joined) - len(whole)) < 64 * cuts  # restarts cost a few bytes


@pytest.mark.parametrize(("width", "height", "count"), SIZES)
def test_a_png_in_strips_is_one_checked_stream_of_the_same_pixels(
    width: int, height: int, count: int, make_strips: MakeStrips,
) -> None:
    pixels = _frame(width, height)
    strips = make_strips(count)
    joined = encode_png(Frame(pixels), strips)
    assert strips.frames_cut == 1
    rgb = np.ascontiguousarray(pixels[..., 2::-1])
    assert np.array_equal(_decoded(joined, "PNG"), rgb)
    # One IDAT whose zlib stream checks out (header, Adler-32 of all rows) in zlib itself.
    (length,) = struct.unpack(">I", joined[33:37])
    assert joined[37:41] == b"IDAT"
    rows = zlib.decompress(joined[41:41 + length])
    assert rows == np.concatenate([np.zeros((height, 1), np.uint8),
                                   rgb.reshape(height, -1)], axis=1).tobytes()
    whole = encode_png(Frame(pixels))
    assert abs(len(joined) - len(whole)) <= max(128 * count, len(whole) // 1000)


@pytest.mark.parametrize(("width", "height", "count"), SIZES)
def test_a_frame_deflated_in_strips_is_one_checked_zlib_stream_of_its_bytes(
    width: int, height: int, count: int, make_strips: MakeStrips,
) -> None:
    pixels = _frame(width, height)
    strips = make_strips(count)
    joined = deflate_frame(pixels, strips)
    assert strips.frames_cut == 1
    # zlib itself checks the header and the Adler-32 of all the bytes.
    assert zlib.decompress(joined) == pixels.tobytes()
    whole = deflate_frame(pixels)
    assert zlib.decompress(whole) == pixels.tobytes()
    assert abs(len(joined) - len(whole)) <= max(128 * count, len(whole) // 1000)


def test_adler32_combine_is_zlibs() -> None:
    rng = random.Random(7)
    for _ in range(200):
        first = rng.randbytes(rng.randrange(0, 3000))
        second = rng.randbytes(rng.choice([0, 1, 65520, 65521, 65522, rng.randrange(1, 200000)]))
        assert adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second)) == \
            zlib.adler32(first + second)
    ones = b"\xff" * 5552 * 3  # sums close to the modulus
    assert adler32_combine(zlib.adler32(ones), zlib.adler32(ones), len(ones)) == \
        zlib.adler32(ones + ones)


def test_more_than_eight_strips_cycle_the_restart_markers() -> None:
    pixels = _frame(1024, 16 * 10)
    parts = [encode_jpeg(pixels[top:top + 16], 80) for top in range(0, 160, 16)]
    joined = join_strips(parts, 1024, 160, 16)
    assert [_markers(joined, code, code) for code in range(0xD0, 0xD8)] == \
        [2, 1, 1, 1, 1, 1, 1, 1]
    assert np.array_equal(_decoded(joined, "JPEG"), _decoded(encode_jpeg(pixels, 80), "JPEG"))


def test_a_small_frame_or_one_cpu_is_encoded_whole(make_strips: MakeStrips) -> None:
    assert strip_starts(1280, 800, 1) == [0]
    assert strip_starts(400, 300, 4) == [0]  # 120,000 pixels: not worth a hand-off
    assert strip_starts(1280, 800, 2) == [0, 400]
    assert strip_starts(1280, 801, 2) == [0, 401]
    assert jpeg_strip_starts(1281, 801, 2) == [0, 416]  # 51 MCU rows: 26 + 25
    assert jpeg_strip_starts(1366, 768, 4) == [0, 192, 384, 576]
    strips = make_strips(1)
    pixels = _frame(1280, 800)
    assert encode(Frame(pixels), "jpeg", 75, strips).data == encode_jpeg(pixels, 75)
    assert encode_png(Frame(pixels), strips) == encode_png(Frame(pixels))
    assert deflate_frame(pixels, strips) == deflate_frame(pixels)
    assert strips.frames_cut == 0


def test_a_strip_too_big_for_a_restart_interval_is_not_cut() -> None:
    # 512 MCUs a row: two strips of 256 MCU rows would need 131,072 MCUs per interval,
    # over DRI's 16-bit field.
    assert jpeg_strip_starts(8192, 8192, 2) == [0]
    assert jpeg_strip_starts(8192, 8192, 4) == [0]
    assert jpeg_strip_starts(4096, 4096, 4) == [0, 1024, 2048, 3072]  # 256 x 64 = 16,384


def test_strips_with_other_tables_are_refused() -> None:
    pixels = _frame(1280, 800)
    parts = [encode_jpeg(pixels[:400], 75), encode_jpeg(pixels[400:], 50)]
    with pytest.raises(ValueError, match="different tables"):
        join_strips(parts, 1280, 800, 400)
    with pytest.raises(ValueError, match="not a whole JPEG"):
        join_strips([parts[0][:-2], parts[1]], 1280, 800, 400)


def test_pieces_no_helper_started_are_encoded_by_the_caller(make_strips: MakeStrips) -> None:
    """A helper without a CPU (here: held on its first piece) holds up the frame by that
    piece at most: the caller takes the pieces it has not started."""
    strips = make_strips(2)
    helper_started, helper_may_finish = threading.Event(), threading.Event()
    ran: dict[int, str] = {}

    def work(piece: int) -> int:
        ran[piece] = threading.current_thread().name
        if threading.current_thread() is not threading.main_thread():
            helper_started.set()
            assert helper_may_finish.wait(10)
        elif piece == 0:
            assert helper_started.wait(10)
        elif piece == 2:
            helper_may_finish.set()
        return piece * 10

    assert strips.map(work, [0, 1, 2, 3]) == [0, 10, 20, 30]
    assert ran[1].startswith("encode")
    assert {ran[0], ran[2], ran[3]} == {threading.main_thread().name}


def test_after_a_failed_piece_no_other_piece_starts(make_strips: MakeStrips) -> None:
    strips = make_strips(2)
    helper_started, helper_may_finish = threading.Event(), threading.Event()
    ran: list[int] = []

    def work(piece: int) -> int:
        ran.append(piece)
        if threading.current_thread() is not threading.main_thread():
            helper_started.set()
            assert helper_may_finish.wait(10)
            return piece
        assert helper_started.wait(10)
        threading.Timer(0.2, helper_may_finish.set).start()
        raise RuntimeError("the encoder failed")

    with pytest.raises(RuntimeError, match="the encoder failed"):
        strips.map(work, [0, 1, 2, 3])
    assert sorted(ran) == [0, 1]  # the helper's piece ran out; 2 and 3 never started
    assert strips.map(lambda piece: piece + 1, [0, 1, 2, 3]) == [1, 2, 3, 4]
