"""Frames: raw pixels as the X server gives them (rows of B, G, R, X bytes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from PIL import Image as PILImage

__all__ = ["Frame"]


@dataclass(frozen=True)
class Frame:
    pixels: npt.NDArray[np.uint8]  # shape (height, width, 4), BGRX

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    def to_pil(self) -> PILImage.Image:
        from PIL import Image as PILImage  # only scaling and WebP need Pillow

        return PILImage.frombuffer(
            "RGB", (self.width, self.height), np.ascontiguousarray(self.pixels).tobytes(),
            "raw", "BGRX", 0, 1,
        )

    def scaled(self, width: int, height: int) -> Frame:
        if (width, height) == (self.width, self.height):
            return self
        from PIL import Image as PILImage

        image = self.to_pil().resize((width, height), PILImage.Resampling.BILINEAR)
        rgb = np.asarray(image, dtype=np.uint8)
        bgrx = np.empty((height, width, 4), dtype=np.uint8)
        bgrx[..., 0] = rgb[..., 2]
        bgrx[..., 1] = rgb[..., 1]
        bgrx[..., 2] = rgb[..., 0]
        bgrx[..., 3] = 255
        return Frame(bgrx)
