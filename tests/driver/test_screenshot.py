"""Screenshots show the real pixels: full, region, scaled, coordinate space, zoom, cursor."""

from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deskbox_server.driver.desktop import Desktop
from deskbox_server.driver.shm import MEMFD_NAME, SEALS
from deskbox_server.media import EncodedImage
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Point, Size

from .conftest import EventPage

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def pixels(image: EncodedImage) -> np.ndarray:
    decoded = Image.open(io.BytesIO(image.data)).convert("RGB")
    assert decoded.size == (image.width, image.height)
    return np.asarray(decoded)


def close_to(actual: np.ndarray, colour: tuple[int, int, int], tolerance: int) -> bool:
    return bool(np.all(np.abs(actual.astype(int) - np.array(colour)) <= tolerance))


@pytest.mark.parametrize(("fmt", "tolerance"), [("png", 0), ("webp", 8), ("jpeg", 8)])
def test_full_screenshot_has_the_known_colours(
    page: EventPage, desktop: Desktop, fmt: str, tolerance: int
) -> None:
    shot = desktop.perform(a.Screenshot(format=fmt))  # type: ignore[arg-type]
    assert isinstance(shot, EncodedImage)
    assert shot.media_type == f"image/{fmt}"
    assert (shot.width, shot.height) == (1280, 800)
    image = pixels(shot)
    for (cx, cy), colour in [((200, 150), RED), ((500, 150), GREEN), ((200, 350), BLUE)]:
        x, y = page.to_screen(cx, cy)
        # The middle of each block, away from edges that lossy codecs blur.
        assert close_to(image[y - 20 : y + 20, x - 40 : x + 40], colour, tolerance), (fmt, colour)


def test_region_screenshot(page: EventPage, desktop: Desktop) -> None:
    x, y = page.to_screen(100, 100)
    region = a.Region(x=x, y=y, width=200, height=100)
    shot = desktop.perform(a.Screenshot(format="png", region=region))
    assert isinstance(shot, EncodedImage) and (shot.width, shot.height) == (200, 100)
    assert close_to(pixels(shot), RED, 0)


def test_region_straddling_two_colours(page: EventPage, desktop: Desktop) -> None:
    x, y = page.to_screen(250, 120)
    region = a.Region(x=x, y=y, width=200, height=40)  # 50 px of red, 100 of white, 50 of green
    image = pixels(desktop.perform(a.Screenshot(format="png", region=region)))  # type: ignore[arg-type]
    assert close_to(image[:, :50], RED, 0)
    assert close_to(image[:, 50:150], (255, 255, 255), 0)
    assert close_to(image[:, 150:], GREEN, 0)


def test_scaled_screenshot(page: EventPage, desktop: Desktop) -> None:
    shot = desktop.perform(a.Screenshot(format="png", scale=a.ScaleTo(width=640, height=400)))
    assert isinstance(shot, EncodedImage) and (shot.width, shot.height) == (640, 400)
    image = pixels(shot)
    x, y = page.to_screen(200, 150)
    assert close_to(image[y // 2 - 10 : y // 2 + 10, x // 2 - 20 : x // 2 + 20], RED, 2)


def test_coordinate_space_maps_screenshots_and_points(page: EventPage, desktop: Desktop) -> None:
    space = a.CoordinateSpace(width=640, height=400)
    shot = desktop.run([a.Screenshot(format="png")], view=space).results[0]
    assert isinstance(shot, EncodedImage) and (shot.width, shot.height) == (640, 400)
    assert desktop.run([a.ScreenSize()], view=space).results[0] == Size(width=640, height=400)
    # A click at (x, y) in the 640×400 space lands at (2x, 2y) on the 1280×800 screen.
    desktop.run([a.Click(x=300, y=230)], view=space)
    click = page.wait_for(lambda es: [e for e in es if e["type"] == "click"])[0]
    assert (click["screenX"], click["screenY"]) == (600, 460)
    assert desktop.run([a.CursorPosition()], view=space).results[0] == Point(x=300, y=230)
    # A region in the space is a region of the scaled screenshot.
    x, y = page.to_screen(100, 100)
    region = a.Region(x=x // 2 + 5, y=y // 2 + 5, width=90, height=40)
    crop = desktop.run([a.Screenshot(format="png", region=region)], view=space).results[0]
    assert isinstance(crop, EncodedImage) and (crop.width, crop.height) == (90, 40)
    assert close_to(pixels(crop), RED, 2)


def test_zoom_gives_the_region_at_full_resolution(page: EventPage, desktop: Desktop) -> None:
    space = a.CoordinateSpace(width=640, height=400)
    x, y = page.to_screen(100, 100)
    region = a.Region(x=x // 2 + 2, y=y // 2 + 2, width=90, height=40)
    zoomed = desktop.run([a.Zoom(region=region)], view=space).results[0]
    assert isinstance(zoomed, EncodedImage) and (zoomed.width, zoomed.height) == (180, 80)
    assert close_to(pixels(zoomed), RED, 0)


def test_cursor_is_drawn_only_when_asked(page: EventPage, desktop: Desktop) -> None:
    x, y = page.to_screen(200, 150)  # over the red block
    desktop.perform(a.Move(x=x, y=y))
    region = a.Region(x=x - 30, y=y - 30, width=60, height=60)
    plain = pixels(desktop.perform(a.Screenshot(format="png", region=region)))  # type: ignore[arg-type]
    with_cursor = pixels(
        desktop.perform(a.Screenshot(format="png", region=region, cursor=True))  # type: ignore[arg-type]
    )
    assert close_to(plain, RED, 0)
    assert not close_to(with_cursor, RED, 0)


def test_screenshot_after_actions_waits_for_the_screen_to_settle(
    page: EventPage, desktop: Desktop
) -> None:
    # The page turns the red block black 30 ms after a click, so the screen changes after the
    # click has returned: only waiting for the screen to go quiet catches it.
    page.cdp.evaluate(
        "document.getElementById('pad').addEventListener('click', () => setTimeout(() =>"
        " document.getElementById('red').style.background = '#000000', 30))"
    )
    x, y = page.to_screen(700, 450)
    result = desktop.run([a.Click(x=x, y=y)], screenshot=a.Screenshot(format="png"))
    assert result.settled
    assert result.screenshot is not None
    bx, by = page.to_screen(200, 150)
    assert close_to(pixels(result.screenshot)[by - 5 : by + 5, bx - 5 : bx + 5], (0, 0, 0), 0)


def test_shared_memory_buffer_is_sealed(desktop: Desktop) -> None:
    """A hostile X server must not be able to shrink the buffer we read (SIGBUS)."""
    desktop.perform(a.Screenshot())
    assert desktop.capture_method == "xshm"
    mappings = [
        line.split()[0]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if MEMFD_NAME in line
    ]
    assert mappings
    for span in mappings:
        # Root may open a mapping's file through map_files, as the X server's side could.
        fd = os.open(f"/proc/self/map_files/{span}", os.O_RDWR)
        try:
            assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS == SEALS
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)


def test_getimage_capture_without_shared_memory(page: EventPage, local_desktop: object) -> None:
    from deskbox_server.driver.local import LocalDesktop

    assert isinstance(local_desktop, LocalDesktop)
    plain = Desktop(local_desktop.display_name, shared_memory=False)
    try:
        x, y = page.to_screen(100, 100)
        region = a.Region(x=x, y=y, width=200, height=100)
        shot = plain.perform(a.Screenshot(format="png", region=region))
        assert isinstance(shot, EncodedImage)
        assert plain.capture_method == "getimage"
        assert close_to(pixels(shot), RED, 0)
    finally:
        plain.close()
