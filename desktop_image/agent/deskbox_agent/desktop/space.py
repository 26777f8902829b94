"""Mapping between screen pixels and the coordinate space a model sees."""

from __future__ import annotations

from dataclasses import dataclass

from .actions import Region
from .errors import InvalidAction

__all__ = ["Space"]


@dataclass(frozen=True)
class Space:
    """``screen`` is the X screen's size; ``view`` the size coordinates are given in."""

    screen_width: int
    screen_height: int
    view_width: int
    view_height: int

    @property
    def identity(self) -> bool:
        return (self.screen_width, self.screen_height) == (self.view_width, self.view_height)

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        if not (0 <= x < self.view_width and 0 <= y < self.view_height):
            raise InvalidAction(
                f"point ({x}, {y}) is outside the {self.view_width}x{self.view_height} screen"
            )
        if self.identity:
            return x, y
        sx = min(round(x * self.screen_width / self.view_width), self.screen_width - 1)
        sy = min(round(y * self.screen_height / self.view_height), self.screen_height - 1)
        return sx, sy

    def from_screen(self, x: int, y: int) -> tuple[int, int]:
        if self.identity:
            return x, y
        vx = min(round(x * self.view_width / self.screen_width), self.view_width - 1)
        vy = min(round(y * self.view_height / self.screen_height), self.view_height - 1)
        return vx, vy

    def region_to_screen(self, region: Region) -> tuple[int, int, int, int]:
        """A region in view coordinates → (x, y, width, height) in screen pixels."""
        if (
            region.x + region.width > self.view_width
            or region.y + region.height > self.view_height
        ):
            raise InvalidAction(
                f"region {region.width}x{region.height}+{region.x}+{region.y} reaches outside "
                f"the {self.view_width}x{self.view_height} screen"
            )
        if self.identity:
            return region.x, region.y, region.width, region.height
        fx = self.screen_width / self.view_width
        fy = self.screen_height / self.view_height
        # Clamped like points: the last view column of a view over twice the screen's
        # size rounds to the column past the screen's edge, which X refuses to capture.
        x0 = min(round(region.x * fx), self.screen_width - 1)
        y0 = min(round(region.y * fy), self.screen_height - 1)
        x1 = min(round((region.x + region.width) * fx), self.screen_width)
        y1 = min(round((region.y + region.height) * fy), self.screen_height)
        return x0, y0, max(x1 - x0, 1), max(y1 - y0, 1)
