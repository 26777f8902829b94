"""Encoding frames: JPEG with libjpeg-turbo (simplejpeg), PNG with ISA-L's deflate, WebP.
A look someone waits for is encoded on several CPUs, in strips (strips.py): a JPEG's
joined by restart markers (jpeg_strips.py), a PNG's as one deflate stream (here), as is
the raw frame a pause keeps (:func:`deflate_frame`).

PNG is the SDK's default and what Anthropic's tool returns, so it has its own fast path:
the rows go out unfiltered (filter type 0) as 8-bit RGB, deflated by ISA-L at level 1.
On a 1280x800 page of text (bench/agent_desktop.py's) that is 3.2 ms and 296 KiB, row
conversion included; zlib level 1 on the same rows takes 13 ms for 255 KiB, Pillow's
PNG (zlib level 1, what the host driver does) 40 ms for 272 KiB. The Up and Sub filters
make ISA-L's output larger (353-360 KiB) and slower (6-7 ms); levels 2 and 3 save under
1 % for 20-100 % more time.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from isal import isal_zlib

from .errors import InvalidAction
from .frame import Frame
from .jpeg_strips import encode_jpeg, jpeg_in_strips
from .strips import Strips, cut, strip_starts

__all__ = ["MEDIA_TYPES", "EncodedImage", "deflate_frame", "encode", "encode_png"]

MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A zlib stream's header: deflate with a 32 KiB window, the fastest level (RFC 1950).
_ZLIB_HEADER = b"\x78\x01"
_ADLER_BASE = 65521


@dataclass(frozen=True)
class EncodedImage:
    media_type: str
    data: bytes
    width: int
    height: int


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(data, zlib.crc32(kind)) & 0xFFFFFFFF)


def _png_rows(pixels: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """One pass from BGRX to the scanlines PNG wants: a 0 (no filter) byte, then R, G, B."""
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 0
    rgb = rows[:, 1:].reshape(height, width, 3)
    rgb[..., 0] = pixels[..., 2]
    rgb[..., 1] = pixels[..., 1]
    rgb[..., 2] = pixels[..., 0]
    return rows


# One strip's bytes deflated: the raw deflate blocks, the Adler-32 of the bytes, their length.
_Run = tuple[bytes, int, int]


def _deflated(data: npt.NDArray[np.uint8], last: bool) -> _Run:
    """A strip's bytes as raw deflate blocks: the last strip's blocks end the stream, the
    others' end on a byte boundary (Z_SYNC_FLUSH), so the strips' blocks follow one another
    as one stream. ``data`` is C-contiguous."""
    deflate = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
    blocks = deflate.compress(data.data) + deflate.flush(
        isal_zlib.Z_FINISH if last else isal_zlib.Z_SYNC_FLUSH)
    return blocks, isal_zlib.adler32(data.data), data.nbytes


def _png_strip(pixels: npt.NDArray[np.uint8], last: bool) -> _Run:
    # Filter 0 makes every row stand alone: a strip's rows need none before them.
    return _deflated(_png_rows(pixels), last)


def _zlib_stream(runs: list[_Run]) -> bytes:
    """The strips' deflate runs as one zlib stream (RFC 1950): header, runs, Adler-32."""
    adler = runs[0][1]
    for _, run_adler, length in runs[1:]:
        adler = adler32_combine(adler, run_adler, length)
    return b"".join([_ZLIB_HEADER, *(blocks for blocks, _, _ in runs),
                     struct.pack(">I", adler)])


def _in_strips(pixels: npt.NDArray[np.uint8], strips: Strips | None,
               strip: Callable[[npt.NDArray[np.uint8], bool], _Run]) -> bytes | None:
    """``strip`` of each horizontal strip of ``pixels`` on the strips' threads, joined into
    one zlib stream; None when the frame is not worth cutting (small, or one CPU)."""
    if strips is None:
        return None
    starts = strip_starts(int(pixels.shape[1]), int(pixels.shape[0]), strips.pieces)
    if len(starts) < 2:
        return None
    pieces = cut(pixels, starts)
    last = len(pieces) - 1
    return _zlib_stream(strips.map(lambda index: strip(pieces[index], index == last),
                                   range(len(pieces))))


def deflate_frame(pixels: npt.NDArray[np.uint8], strips: Strips | None = None) -> bytes:
    """A frame's raw bytes (C-contiguous rows) as one zlib stream at the fastest level: in
    strips on several CPUs when it is large (a pause waits for this one)."""
    joined = _in_strips(pixels, strips, _deflated)
    return isal_zlib.compress(pixels.data, 1) if joined is None else joined


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of two byte strings one after the other, from theirs (zlib's
    adler32_combine, which Python's zlib does not offer)."""
    rem = second_length % _ADLER_BASE
    sum1 = ((first & 0xFFFF) + (second & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
    sum2 = (rem * (first & 0xFFFF) + (first >> 16) + (second >> 16) + _ADLER_BASE - rem
            ) % _ADLER_BASE
    return sum1 | (sum2 << 16)


def encode_png(frame: Frame, strips: Strips | None = None) -> bytes:
    pixels = frame.pixels
    idat = _in_strips(pixels, strips, _png_strip)
    if idat is None:
        idat = isal_zlib.compress(_png_rows(pixels).data, 1)
    header = struct.pack(">IIBBBBB", frame.width, frame.height, 8, 2, 0, 0, 0)
    return b"".join((_PNG_SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", idat),
                     _chunk(b"IEND", b"")))


WEBP_MAX_SIDE = 16_383  # the format's own bound (libwebp); the API's sides go to 16384


def encode(
    frame: Frame, fmt: Literal["jpeg", "png", "webp"], quality: int,
    strips: Strips | None = None,
) -> EncodedImage:
    """With ``strips`` (for a look someone waits for), JPEG and PNG are encoded on the
    sandbox's CPUs together; without, on this thread alone."""
    data: bytes
    if fmt == "jpeg":
        pixels = np.ascontiguousarray(frame.pixels)
        data = (encode_jpeg(pixels, quality) if strips is None
                else jpeg_in_strips(pixels, quality, strips))
    elif fmt == "png":
        data = encode_png(frame, strips)
    else:
        import io

        if max(frame.width, frame.height) > WEBP_MAX_SIDE:
            raise InvalidAction(
                f"a WebP image is at most {WEBP_MAX_SIDE} pixels a side, this one would be "
                f"{frame.width}x{frame.height}: ask for PNG or JPEG, or a smaller scale")
        buffer = io.BytesIO()
        frame.to_pil().save(buffer, format="WEBP", quality=quality, method=0)
        data = buffer.getvalue()
    return EncodedImage(MEDIA_TYPES[fmt], bytes(data), frame.width, frame.height)
