"""Encoding frames: JPEG with libjpeg-turbo (simplejpeg), PNG with ISA-L's deflate, WebP.

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
from dataclasses import dataclass
from typing import Literal

import numpy as np
import simplejpeg
from isal import isal_zlib

from .frame import Frame

__all__ = ["MEDIA_TYPES", "EncodedImage", "encode", "encode_png"]

MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class EncodedImage:
    media_type: str
    data: bytes
    width: int
    height: int


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(
        ">I", zlib.crc32(data, zlib.crc32(kind)) & 0xFFFFFFFF)


def encode_png(frame: Frame) -> bytes:
    height, width = frame.height, frame.width
    # One pass from BGRX to the scanlines PNG wants: a 0 (no filter) byte, then R, G, B.
    rows = np.empty((height, 1 + 3 * width), dtype=np.uint8)
    rows[:, 0] = 0
    rgb = rows[:, 1:].reshape(height, width, 3)
    pixels = frame.pixels
    rgb[..., 0] = pixels[..., 2]
    rgb[..., 1] = pixels[..., 1]
    rgb[..., 2] = pixels[..., 0]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = isal_zlib.compress(rows.data, 1)
    return b"".join((_PNG_SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", idat),
                     _chunk(b"IEND", b"")))


def encode(frame: Frame, fmt: Literal["jpeg", "png", "webp"], quality: int) -> EncodedImage:
    if fmt == "jpeg":
        # libjpeg-turbo reads BGRX rows directly: no colour conversion pass in Python.
        data = simplejpeg.encode_jpeg(
            np.ascontiguousarray(frame.pixels), quality=quality, colorspace="BGRX",
            colorsubsampling="420", fastdct=True,
        )
    elif fmt == "png":
        data = encode_png(frame)
    else:
        import io

        buffer = io.BytesIO()
        frame.to_pil().save(buffer, format="WEBP", quality=quality, method=0)
        data = buffer.getvalue()
    return EncodedImage(MEDIA_TYPES[fmt], bytes(data), frame.width, frame.height)
