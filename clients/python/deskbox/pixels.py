"""Screen pixels of what a Playwright script located, for Deskbox's pixel actions.

A script connected with ``connect_over_cdp(session["urls"]["cdp_http"])`` finds an element;
an agent acting on the same session clicks screen pixels. :func:`screen_point` maps one to
the other::

    point = screen_point(page, "#submit")            # or a Locator / ElementHandle
    deskbox_post("/actions", {"type": "click", "x": point.x, "y": point.y})

How: the element's box (``bounding_box()``: CSS pixels of the top document's layout
viewport, iframes included) goes through the pinch-zoom visual viewport, the page zoom
(CSS px → device-independent pixels), the browser window's position on screen
(``Browser.getWindowForTarget``) and its chrome (tab strip and toolbar: ``outerHeight`` -
``innerHeight``), and the device scale factor (DIP → screen pixels). The arithmetic is
:meth:`PageGeometry.to_screen`, a pure function; :func:`screen_point` and
:func:`screen_point_async` read the numbers through Playwright's sync or async API.
Playwright itself is not imported here: pages are used by their methods only.

Limits: the window's side borders are taken as equal and its bottom border as wide as they
are (true of Chromium's maximized windows, the Deskbox default); a point is rounded to
whole pixels, and ``innerHeight`` is a whole number of CSS pixels, so at a page zoom that
is not 100% the point can be off by under a pixel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

__all__ = [
    "GEOMETRY_SCRIPT",
    "PageGeometry",
    "ScreenPoint",
    "geometry_from",
    "screen_point",
    "screen_point_async",
]

GEOMETRY_SCRIPT = """() => ({
  screenX: window.screenX, screenY: window.screenY,
  outerWidth: window.outerWidth, outerHeight: window.outerHeight,
  innerWidth: window.innerWidth, innerHeight: window.innerHeight,
  devicePixelRatio: window.devicePixelRatio,
  screenWidth: screen.width, screenHeight: screen.height,
  visualLeft: visualViewport ? visualViewport.offsetLeft : 0,
  visualTop: visualViewport ? visualViewport.offsetTop : 0,
  visualScale: visualViewport ? visualViewport.scale : 1,
})"""


class ScreenPoint(NamedTuple):
    x: int
    y: int


@dataclass(frozen=True)
class PageGeometry:
    """Where a page's viewport is on screen. Lengths in device-independent pixels (DIP)
    unless named ``inner_*`` (CSS pixels of the layout viewport, as ``window.inner*``)."""

    window_left: float
    window_top: float
    outer_width: float
    outer_height: float
    inner_width: float
    inner_height: float
    zoom: float = 1.0  # page zoom: DIP per CSS pixel
    device_scale: float = 1.0  # screen pixels per DIP
    visual_left: float = 0.0  # pinch zoom: the visual viewport's offset (CSS px) and scale
    visual_top: float = 0.0
    visual_scale: float = 1.0
    screen_width: float = 0.0  # DIP (screen.width); used for coordinate spaces
    screen_height: float = 0.0

    @property
    def viewport_origin(self) -> tuple[float, float]:
        """The viewport's top-left corner on screen, in DIP."""
        border = max(0.0, (self.outer_width - self.inner_width * self.zoom) / 2)
        top = self.outer_height - self.inner_height * self.zoom - border
        return self.window_left + border, self.window_top + max(0.0, top)

    def to_screen(
        self, x: float, y: float, coordinate_space: tuple[int, int] | None = None
    ) -> ScreenPoint:
        """Client coordinates (CSS px, as ``getBoundingClientRect``) → screen pixels, or
        pixels of ``coordinate_space`` (the session's or the request's W×H)."""
        left, top = self.viewport_origin
        factor = self.visual_scale * self.zoom
        sx = (left + (x - self.visual_left) * factor) * self.device_scale
        sy = (top + (y - self.visual_top) * factor) * self.device_scale
        if coordinate_space is not None:
            if self.screen_width <= 0 or self.screen_height <= 0:
                raise ValueError("mapping to a coordinate space needs the screen's size")
            sx *= coordinate_space[0] / (self.screen_width * self.device_scale)
            sy *= coordinate_space[1] / (self.screen_height * self.device_scale)
        return ScreenPoint(round(sx), round(sy))


def _number(values: Mapping[str, Any], key: str, default: float) -> float:
    value = values.get(key, default)
    return float(value) if isinstance(value, int | float) else default


def geometry_from(
    page: Mapping[str, Any],
    window_bounds: Mapping[str, Any] | None = None,
    layout_metrics: Mapping[str, Any] | None = None,
) -> PageGeometry:
    """A :class:`PageGeometry` from what :data:`GEOMETRY_SCRIPT` returned in the page, the
    ``bounds`` of ``Browser.getWindowForTarget`` and the result of ``Page.getLayoutMetrics``
    (both optional: ``screenX``/``screenY`` and a zoom of 1 stand in)."""
    ratio = _number(page, "devicePixelRatio", 1.0) or 1.0
    zoom = 1.0
    if layout_metrics is not None:
        visual = layout_metrics.get("cssVisualViewport")
        if isinstance(visual, Mapping):
            zoom = _number(visual, "zoom", 1.0) or 1.0
    bounds = window_bounds or {}
    return PageGeometry(
        window_left=_number(bounds, "left", _number(page, "screenX", 0.0)),
        window_top=_number(bounds, "top", _number(page, "screenY", 0.0)),
        outer_width=_number(page, "outerWidth", 0.0),
        outer_height=_number(page, "outerHeight", 0.0),
        inner_width=_number(page, "innerWidth", 0.0),
        inner_height=_number(page, "innerHeight", 0.0),
        zoom=zoom,
        device_scale=ratio / zoom,
        visual_left=_number(page, "visualLeft", 0.0),
        visual_top=_number(page, "visualTop", 0.0),
        visual_scale=_number(page, "visualScale", 1.0) or 1.0,
        screen_width=_number(page, "screenWidth", 0.0),
        screen_height=_number(page, "screenHeight", 0.0),
    )


# -- Playwright, by duck typing (sync and async APIs) -----------------------------------------


class _Located(Protocol):
    def bounding_box(self) -> Any: ...


class _Page(Protocol):
    @property
    def context(self) -> Any: ...

    def evaluate(self, expression: str) -> Any: ...

    def locator(self, selector: str) -> Any: ...


def _center(box: Any, what: object) -> tuple[float, float]:
    if not isinstance(box, Mapping):
        raise ValueError(f"{what!r} is not visible (it has no box)")
    return (float(box["x"]) + float(box["width"]) / 2,
            float(box["y"]) + float(box["height"]) / 2)


def screen_point(
    page: _Page,
    target: str | _Located,
    coordinate_space: tuple[int, int] | None = None,
    scroll: bool = True,
) -> ScreenPoint:
    """The screen pixel at the centre of ``target`` (a CSS selector, a Locator or an
    ElementHandle of ``page``), with Playwright's sync API. ``scroll`` first scrolls it into
    view; ``coordinate_space`` maps to a W×H space instead of screen pixels."""
    located = page.locator(target).first if isinstance(target, str) else target
    if scroll and hasattr(located, "scroll_into_view_if_needed"):
        located.scroll_into_view_if_needed()
    x, y = _center(located.bounding_box(), target)
    session = page.context.new_cdp_session(page)
    try:
        bounds = session.send("Browser.getWindowForTarget")["bounds"]
        metrics = session.send("Page.getLayoutMetrics")
    finally:
        session.detach()
    geometry = geometry_from(page.evaluate(GEOMETRY_SCRIPT), bounds, metrics)
    return geometry.to_screen(x, y, coordinate_space)


async def screen_point_async(
    page: Any,
    target: Any,
    coordinate_space: tuple[int, int] | None = None,
    scroll: bool = True,
) -> ScreenPoint:
    """:func:`screen_point` with Playwright's async API."""
    located = page.locator(target).first if isinstance(target, str) else target
    if scroll and hasattr(located, "scroll_into_view_if_needed"):
        await located.scroll_into_view_if_needed()
    x, y = _center(await located.bounding_box(), target)
    session = await page.context.new_cdp_session(page)
    try:
        bounds = (await session.send("Browser.getWindowForTarget"))["bounds"]
        metrics = await session.send("Page.getLayoutMetrics")
    finally:
        await session.detach()
    geometry = geometry_from(await page.evaluate(GEOMETRY_SCRIPT), bounds, metrics)
    return geometry.to_screen(x, y, coordinate_space)
