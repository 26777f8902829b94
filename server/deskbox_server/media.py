"""Frames (raw BGRX pixels) and their encoding to JPEG, PNG and WebP: the images that pass
between a desktop, the session layer and the API, whichever of them made the image."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import simplejpeg
from PIL import Image as PILImage

__all__ = ["EncodedImage", "Frame", "encode"]

MEDIA_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


@dataclass(frozen=True)
class EncodedImage:
    media_type: str
    data: bytes
    width: int
    height: int


@dataclass(frozen=True)
class Frame:
    """Pixels as the X server gives them: rows of B, G, R, X bytes."""

    pixels: npt.NDArray[np.uint8]  # shape (height, width, 4)

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    def to_pil(self) -> PILImage.Image:
        height, width = self.pixels.shape[:2]
        return PILImage.frombuffer(
            "RGB", (width, height), self.pixels.tobytes(), "raw", "BGRX", 0, 1
        )

    def scaled(self, width: int, height: int) -> Frame:
        if (width, height) == (self.width, self.height):
            return self
        image = self.to_pil().resize((width, height), PILImage.Resampling.BILINEAR)
        rgb = np.asarray(image, dtype=np.uint8)
        bgrx = np.empty((height, width, 4), dtype=np.uint8)
        bgrx[..., 0] = rgb[..., 2]
        bgrx[..., 1] = rgb[..., 1]
        bgrx[..., 2] = rgb[..., 0]
        bgrx[..., 3] = 255
        return Frame(bgrx)


def encode(frame: Frame, fmt: Literal["jpeg", "png", "webp"], quality: int) -> EncodedImage:
    if fmt == "jpeg":
        # libjpeg-turbo reads BGRX rows directly: no colour conversion pass in Python.
        data = simplejpeg.encode_jpeg(
            np.ascontiguousarray(frame.pixels), quality=quality, colorspace="BGRX",
            colorsubsampling="420", fastdct=True,
        )
    else:
        buffer = io.BytesIO()
        image = frame.to_pil()
        if fmt == "png":
            image.save(buffer, format="PNG", compress_level=1)
        else:
            image.save(buffer, format="WEBP", quality=quality, method=0)
        data = buffer.getvalue()
    return EncodedImage(MEDIA_TYPES[fmt], bytes(data), frame.width, frame.height)
