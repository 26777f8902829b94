"""A look at a screen that has not changed is the last look's bytes, and never a stale one.

The agent's ``Desktop`` on a real Xvfb (with openbox), in this process; a second X client
paints a window of its own between looks, as a browser would, without any action of the
desktop's. Every look must show what the screen shows; the counter says which were reused.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from PIL import Image
from Xlib.display import Display
from Xlib.xobject.drawable import Window

from deskbox_agent.desktop import actions as a
from deskbox_agent.desktop import desktop as desktop_module
from deskbox_agent.desktop.desktop import Desktop
from deskbox_agent.desktop.encode import EncodedImage

from ..local_desktop import HostDesktop

PNG = a.Screenshot(format="png")
QUICK = a.SettleOptions(quiet_s=0.05, timeout_s=2.0)


class Painter:
    """Another client's window across the screen, filled with one colour at a time."""

    def __init__(self, display_name: str) -> None:
        self.x = Display(display_name)
        screen = self.x.screen()
        self.window: Window = screen.root.create_window(
            0, 0, screen.width_in_pixels, screen.height_in_pixels, 0, screen.root_depth,
            override_redirect=True)
        self.window.map()
        self.x.sync()

    def fill(self, rgb: tuple[int, int, int], box: tuple[int, int, int, int] | None = None) -> None:
        pixel = rgb[0] << 16 | rgb[1] << 8 | rgb[2]
        gc = self.window.create_gc(foreground=pixel)
        x, y, width, height = box or (0, 0, 1280, 800)
        self.window.fill_rectangle(gc, x, y, width, height)
        gc.free()
        self.x.sync()  # drawn when this returns: the next look must see it

    def close(self) -> None:
        self.window.destroy()
        self.x.close()


@pytest.fixture(scope="module")
def desktop() -> Iterator[Desktop]:
    with HostDesktop(browser=False) as host:
        desktop = Desktop(host.display_name)
        desktop.settle_options = QUICK
        try:
            yield desktop
        finally:
            desktop.close()


@pytest.fixture
def painter(desktop: Desktop) -> Iterator[Painter]:
    painter = Painter(desktop.display_name)
    yield painter
    painter.close()


def look(desktop: Desktop, shot: a.Screenshot = PNG) -> EncodedImage:
    result = desktop.run([], screenshot=shot)
    assert result.screenshot is not None and result.settled
    return result.screenshot


def colour_at(image: EncodedImage, x: int, y: int) -> tuple[int, ...]:
    pixel = Image.open(io.BytesIO(image.data)).convert("RGB").getpixel((x, y))
    assert isinstance(pixel, tuple)
    return pixel


def test_a_second_look_at_an_unchanged_screen_is_the_first_looks_bytes(
        desktop: Desktop, painter: Painter) -> None:
    painter.fill((200, 0, 0))
    first = look(desktop)
    reused = desktop.screenshots_reused
    second = look(desktop)
    assert desktop.screenshots_reused == reused + 1
    assert second.data == first.data and colour_at(second, 640, 400) == (200, 0, 0)
    # A screenshot among the actions (no settling: "the screen, now") is reused alike.
    as_action = desktop.run([PNG]).results[0]
    assert desktop.screenshots_reused == reused + 2
    assert isinstance(as_action, EncodedImage) and as_action.data == first.data


def test_a_change_right_before_a_look_among_the_actions_is_shown(
        desktop: Desktop, painter: Painter) -> None:
    """Without a settle wait, the look's own round trip reads the damage before it."""
    painter.fill((200, 0, 0))
    look(desktop)
    for colour in ((0, 200, 0), (0, 0, 200)):
        painter.fill(colour, (600, 380, 80, 40))
        shot = desktop.run([PNG]).results[0]
        assert isinstance(shot, EncodedImage) and colour_at(shot, 640, 400) == colour


def test_a_change_by_another_client_is_shown_at_once(desktop: Desktop, painter: Painter) -> None:
    painter.fill((200, 0, 0))
    look(desktop)
    reused = desktop.screenshots_reused
    for colour in ((0, 200, 0), (0, 0, 200), (200, 200, 0)):
        painter.fill(colour, (600, 380, 80, 40))  # a small part of the screen
        assert colour_at(look(desktop), 640, 400) == colour
    assert desktop.screenshots_reused == reused


def test_a_change_undone_before_the_look_is_a_new_capture_of_the_same_picture(
        desktop: Desktop, painter: Painter) -> None:
    painter.fill((0, 0, 200))
    first = look(desktop)
    reused = desktop.screenshots_reused
    painter.fill((0, 200, 0))
    painter.fill((0, 0, 200))
    again = look(desktop)
    assert desktop.screenshots_reused == reused  # damage, so no reuse: no pixel compare
    assert again.data == first.data


@pytest.mark.parametrize("other", [
    a.Screenshot(format="jpeg"),
    a.Screenshot(format="png", scale=a.ScaleTo(width=640, height=400)),
    a.Screenshot(format="png", region=a.Region(x=0, y=0, width=100, height=100)),
], ids=["format", "scale", "region"])
def test_a_look_asked_for_otherwise_is_encoded_afresh(
        desktop: Desktop, painter: Painter, other: a.Screenshot) -> None:
    painter.fill((0, 200, 200))
    look(desktop)
    reused = desktop.screenshots_reused
    image = look(desktop, other)
    assert desktop.screenshots_reused == reused
    assert image.media_type != "image/png" or (image.width, image.height) != (1280, 800)
    assert look(desktop).data != image.data  # the png of the whole screen is taken again


def test_a_look_with_the_cursor_is_never_reused(desktop: Desktop, painter: Painter) -> None:
    """The pointer moves without damage: a look that draws it is always captured."""
    painter.fill((0, 0, 0))
    with_cursor = a.Screenshot(format="png", cursor=True)
    desktop.run([a.Move(x=100, y=100)])
    look(desktop, with_cursor)
    desktop.run([a.Move(x=900, y=600)])
    reused = desktop.screenshots_reused
    moved = look(desktop, with_cursor)
    assert desktop.screenshots_reused == reused
    assert colour_at(moved, 901, 601) != (0, 0, 0)  # the arrow's body at its new place


def test_the_window_manager_moving_a_window_is_a_change(desktop: Desktop) -> None:
    """Not only drawing: a window mapped, moved or unmapped changes the picture too."""
    painter = Painter(desktop.display_name)
    try:
        painter.fill((200, 0, 200))
        look(desktop)
        painter.window.configure(x=400)
        painter.x.sync()
        moved = look(desktop)
        assert colour_at(moved, 200, 400) != (200, 0, 200)
        assert colour_at(moved, 800, 400) == (200, 0, 200)
        painter.window.unmap()
        painter.x.sync()
        assert colour_at(look(desktop), 800, 400) != (200, 0, 200)
    finally:
        painter.close()


def test_a_look_too_big_to_keep_is_captured_every_time(
        desktop: Desktop, painter: Painter, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only looks up to REUSE_MAX_BYTES are kept (4 MiB: a look scaled up to 7680x4320 would
    hold tens of MiB in an idle session); here the bound is lowered below this PNG."""
    painter.fill((90, 90, 90))
    monkeypatch.setattr(desktop_module, "REUSE_MAX_BYTES", len(look(desktop).data) - 1)
    painter.fill((90, 90, 90))  # damage: the look kept under the old bound is stale
    look(desktop)
    reused = desktop.screenshots_reused
    assert look(desktop).data == look(desktop).data
    assert desktop.screenshots_reused == reused


def test_a_mark_lets_the_last_look_go(desktop: Desktop, painter: Painter) -> None:
    """Before a checkpoint the host marks the screen: the kept bytes are not dumped."""
    painter.fill((90, 0, 90))
    look(desktop)
    reused = desktop.screenshots_reused
    desktop.mark()
    assert colour_at(look(desktop), 640, 400) == (90, 0, 90)
    assert desktop.screenshots_reused == reused
    look(desktop)
    assert desktop.screenshots_reused == reused + 1  # kept again after the mark
