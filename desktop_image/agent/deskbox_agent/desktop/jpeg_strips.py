"""A JPEG encoded in strips (strips.py), joined by restart markers.

Each strip is a whole number of MCU rows (16 pixels at 4:2:0) and is encoded as a JPEG of
its own; their entropy-coded data are joined into one baseline JPEG: the first strip's
headers with the whole height, a restart interval (DRI) of one strip's MCUs, and an RSTn
marker between strips. A restart resets the DC predictions, as the start of each strip's
own image did, and each MCU is coded on its own (4:2:0 downsampling averages inside a 2x2
block), so the joined file decodes to exactly the pixels of a single encode
(tests/agent/test_encode_strips.py). Restart markers are part of every baseline decoder
(ITU T.81, F.1.2.3).

Anything unexpected in a strip's own file (tables that differ between strips, a marker not
looked for) makes the frame be encoded whole instead: never a broken image.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt
import simplejpeg

from .strips import Strips, cut, strip_starts

__all__ = ["encode_jpeg", "jpeg_in_strips", "jpeg_strip_starts", "join_strips"]

MCU_ROWS = 16  # pixel rows per MCU row at 4:2:0
_MAX_RESTART_INTERVAL = 0xFFFF  # DRI's field: MCUs per restart interval
_SOF0, _DHT, _SOS, _DRI, _RST0 = 0xC0, 0xC4, 0xDA, 0xDD, 0xD0
_U16 = struct.Struct(">H")


def encode_jpeg(pixels: npt.NDArray[np.uint8], quality: int) -> bytes:
    """One encode on this thread: BGRX rows (no colour conversion pass in Python), 4:2:0,
    the fast DCT."""
    return bytes(simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="BGRX",
                                        colorsubsampling="420", fastdct=True))


def jpeg_strip_starts(width: int, height: int, count: int) -> list[int]:
    """:func:`strip_starts` in MCU rows; one strip when a strip would need a restart
    interval over DRI's limit."""
    starts = strip_starts(width, height, count, MCU_ROWS)
    if len(starts) > 1 and (starts[1] // MCU_ROWS) * -(-width // MCU_ROWS) > _MAX_RESTART_INTERVAL:
        return [0]
    return starts


def jpeg_in_strips(pixels: npt.NDArray[np.uint8], quality: int, strips: Strips) -> bytes:
    height, width = int(pixels.shape[0]), int(pixels.shape[1])
    starts = jpeg_strip_starts(width, height, strips.pieces)
    if len(starts) < 2:
        return encode_jpeg(pixels, quality)
    parts = strips.map(lambda rows: encode_jpeg(rows, quality), cut(pixels, starts))
    try:
        return join_strips(parts, width, height, starts[1])
    except ValueError:
        return encode_jpeg(pixels, quality)


def _segments(data: bytes) -> tuple[int, int, int]:
    """(SOF0's offset, SOS's offset, where the entropy-coded data starts) of a baseline
    JPEG as libjpeg-turbo writes it; ValueError for anything else."""
    if data[:2] != b"\xff\xd8" or data[-2:] != b"\xff\xd9":
        raise ValueError("not a whole JPEG")
    offset, sof = 2, -1
    while offset + 4 <= len(data):
        if data[offset] != 0xFF:
            raise ValueError("a header segment without its marker")
        marker = data[offset + 1]
        (length,) = _U16.unpack_from(data, offset + 2)
        if marker == _SOS:
            if sof < 0:
                raise ValueError("no SOF0 before the scan")
            return sof, offset, offset + 2 + length
        if marker == _SOF0:
            sof = offset
        elif marker == _DRI or (0xC1 <= marker <= 0xCF and marker != _DHT):
            raise ValueError(f"marker 0x{marker:02X}: not a plain baseline JPEG")
        offset += 2 + length
    raise ValueError("no scan")


def _with_height(header: bytes, sof: int, height: int) -> bytes:
    at = sof + 5  # SOF0: marker, length, precision, then the height
    return header[:at] + _U16.pack(height) + header[at + 2:]


def join_strips(parts: list[bytes], width: int, height: int, rows_per_strip: int) -> bytes:
    """One JPEG of ``height`` rows from the JPEGs of its strips (all but the last
    ``rows_per_strip`` rows high, a whole number of MCU rows); ValueError if the strips'
    headers differ (other tables) or are not what libjpeg-turbo writes."""
    restart_interval = (rows_per_strip // MCU_ROWS) * -(-width // MCU_ROWS)
    header = b""
    pieces: list[bytes | memoryview] = []  # views: the strips' data is copied once, by the join
    for index, part in enumerate(parts):
        sof, sos, scan = _segments(part)
        this = _with_height(part[:scan], sof, height)
        if not index:
            header = this
            dri = b"\xff\xdd" + _U16.pack(4) + _U16.pack(restart_interval)
            pieces.append(this[:sos] + dri + this[sos:])
        elif this != header:
            raise ValueError("the strips were encoded with different tables")
        else:
            pieces.append(bytes((0xFF, _RST0 + (index - 1) % 8)))
        pieces.append(memoryview(part)[scan:-2])
    pieces.append(b"\xff\xd9")
    return b"".join(pieces)
