"""The SDK's element → screen pixel arithmetic (deskbox.pixels), without a browser.

The numbers are those Chromium 156 reported on a 1280×800 session (maximized window, tab
strip and toolbar 87 px high) at page zooms of 100% and 125%; test_cdp.py proves the
mapping with real clicks.
"""

from __future__ import annotations

import pytest

from deskbox.pixels import PageGeometry, ScreenPoint, geometry_from

AT_100 = {
    "screenX": 0, "screenY": 0, "outerWidth": 1280, "outerHeight": 800,
    "innerWidth": 1280, "innerHeight": 713, "devicePixelRatio": 1,
    "screenWidth": 1280, "screenHeight": 800, "visualLeft": 0, "visualTop": 0,
    "visualScale": 1,
}
BOUNDS = {"left": 0, "top": 0, "width": 1280, "height": 800, "windowState": "maximized"}


def metrics(zoom: float) -> dict[str, object]:
    return {"cssVisualViewport": {"zoom": zoom, "scale": 1, "offsetX": 0, "offsetY": 0}}


def test_the_viewport_starts_below_the_browser_chrome() -> None:
    geometry = geometry_from(AT_100, BOUNDS, metrics(1))
    assert geometry.viewport_origin == (0, 87)
    assert geometry.to_screen(0, 0) == ScreenPoint(0, 87)
    assert geometry.to_screen(500, 150) == (500, 237)


def test_page_zoom_scales_css_pixels() -> None:
    zoomed = {**AT_100, "innerWidth": 1024, "innerHeight": 570, "devicePixelRatio": 1.25}
    geometry = geometry_from(zoomed, BOUNDS, metrics(1.25))
    assert geometry.zoom == 1.25 and geometry.device_scale == 1.0
    x, y = geometry.to_screen(730, 520)  # the centre of #target in test_cdp.py
    assert x == 912 and abs(y - (87 + 650)) <= 1  # innerHeight is rounded: under a pixel


def test_device_scale_window_position_and_pinch_zoom() -> None:
    geometry = PageGeometry(
        window_left=100, window_top=50, outer_width=800, outer_height=600,
        inner_width=800, inner_height=500, zoom=1.0, device_scale=2.0,
        visual_left=10, visual_top=20, visual_scale=2.0, screen_width=1280, screen_height=800,
    )
    # (100 + (60 - 10) * 2) * 2, (50 + 100 + (70 - 20) * 2) * 2
    assert geometry.to_screen(60, 70) == (400, 500)


def test_a_window_with_side_borders() -> None:
    page = {**AT_100, "outerWidth": 1000, "outerHeight": 700, "innerWidth": 990,
            "innerHeight": 600}
    geometry = geometry_from(page, {"left": 40, "top": 30}, None)
    # borders of 5 on each side and at the bottom; the chrome is 700 - 600 - 5 = 95 high
    assert geometry.viewport_origin == (45, 125)


def test_coordinate_spaces() -> None:
    geometry = geometry_from(AT_100, BOUNDS, metrics(1))
    assert geometry.to_screen(500, 150, coordinate_space=(640, 400)) == (250, 118)
    with pytest.raises(ValueError):
        PageGeometry(0, 0, 1280, 800, 1280, 713).to_screen(1, 1, coordinate_space=(640, 400))


def test_missing_values_fall_back_to_the_page_script() -> None:
    geometry = geometry_from({**AT_100, "screenX": 7, "screenY": 9})
    assert (geometry.window_left, geometry.window_top, geometry.zoom) == (7, 9, 1.0)
