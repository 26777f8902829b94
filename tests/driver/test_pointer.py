"""Pointer actions land in the page exactly: position, button, count, modifiers, wheel."""

from __future__ import annotations

import pytest

from deskbox_server.driver.desktop import Desktop
from deskbox_server.schemas import actions as a

from .conftest import EventPage

DOM_BUTTON = {"left": 0, "middle": 1, "right": 2, "back": 3, "forward": 4}


def test_click_lands_at_the_exact_pixel(page: EventPage, desktop: Desktop) -> None:
    for x, y in [(500, 450), (123, 457), (1001, 599)]:
        page.clear()
        desktop.perform(a.Click(x=x, y=y))
        clicks = page.wait_for(lambda es: [e for e in es if e["type"] == "click"])
        assert [(c["screenX"], c["screenY"]) for c in clicks] == [(x, y)]
        assert clicks[0]["button"] == 0 and clicks[0]["detail"] == 1


@pytest.mark.parametrize("button", ["left", "middle", "right", "back", "forward"])
def test_click_buttons(page: EventPage, desktop: Desktop, button: str) -> None:
    x, y = page.to_screen(700, 450)
    desktop.perform(a.Click(x=x, y=y, button=button))  # type: ignore[arg-type]
    ups = page.wait_for(lambda es: [e for e in es if e["type"] == "mouseup"])
    downs = page.events("mousedown")
    assert [d["button"] for d in downs] == [DOM_BUTTON[button]]
    assert [u["button"] for u in ups] == [DOM_BUTTON[button]]
    assert (ups[0]["screenX"], ups[0]["screenY"]) == (x, y)
    if button == "right":
        assert page.wait_for(lambda es: [e for e in es if e["type"] == "contextmenu"])


@pytest.mark.parametrize("count", [2, 3])
def test_multi_click_counts(page: EventPage, desktop: Desktop, count: int) -> None:
    x, y = page.to_screen(700, 450)
    desktop.perform(a.Click(x=x, y=y, count=count))
    clicks = page.wait_for(lambda es: len([e for e in es if e["type"] == "click"]) == count)
    assert clicks
    assert [c["detail"] for c in page.events("click")] == list(range(1, count + 1))
    assert len(page.wait_for(lambda es: [e for e in es if e["type"] == "dblclick"])) == 1


@pytest.mark.parametrize(
    ("modifiers", "flags"),
    [(["shift"], "shift"), (["ctrl"], "ctrl"), (["alt"], "alt"), (["ctrl", "shift"], "ctrl shift")],
)
def test_click_with_modifiers(
    page: EventPage, desktop: Desktop, modifiers: list[str], flags: str
) -> None:
    x, y = page.to_screen(700, 450)
    desktop.perform(a.Click(x=x, y=y, modifiers=modifiers))
    down = page.wait_for(lambda es: [e for e in es if e["type"] == "mousedown"])[0]
    held = {name for name in ("ctrl", "shift", "alt", "meta") if down[name]}
    assert held == set(flags.split())
    # Modifiers are released afterwards: the next click has none.
    page.clear()
    desktop.perform(a.Click(x=x, y=y))
    down = page.wait_for(lambda es: [e for e in es if e["type"] == "mousedown"])[0]
    assert not any(down[name] for name in ("ctrl", "shift", "alt", "meta"))


def test_move_and_cursor_position(page: EventPage, desktop: Desktop) -> None:
    desktop.perform(a.Move(x=811, y=333))
    moves = page.wait_for(lambda es: [e for e in es if e["type"] == "mousemove"])
    assert (moves[-1]["screenX"], moves[-1]["screenY"]) == (811, 333)
    assert desktop.perform(a.CursorPosition()) == a_point(811, 333)


def test_mouse_down_and_up_separately(page: EventPage, desktop: Desktop) -> None:
    x, y = page.to_screen(500, 400)
    desktop.perform(a.MouseDown(x=x, y=y, button="left"))
    desktop.perform(a.MouseUp(x=x + 40, y=y + 20, button="left"))
    ups = page.wait_for(lambda es: [e for e in es if e["type"] == "mouseup"])
    down = page.events("mousedown")[0]
    assert (down["screenX"], down["screenY"]) == (x, y)
    assert (ups[0]["screenX"], ups[0]["screenY"]) == (x + 40, y + 20)


def test_drag_follows_the_path(page: EventPage, desktop: Desktop) -> None:
    path = [page.to_screen(450 + 40 * i, 350 + 15 * i) for i in range(6)]
    desktop.perform(a.Drag(path=path))
    up = page.wait_for(lambda es: [e for e in es if e["type"] == "mouseup"])[0]
    down = page.events("mousedown")[0]
    assert (down["screenX"], down["screenY"]) == path[0]
    assert (up["screenX"], up["screenY"]) == path[-1]
    pressed_moves = [
        (e["screenX"], e["screenY"]) for e in page.events("mousemove") if e["buttons"] == 1
    ]
    assert pressed_moves == path[1:]


# Chromium on X11 turns one wheel notch into 120 px, and may merge notches that arrive
# together into one wheel event: the sum of deltas is what a page (and a user) sees.
PX_PER_NOTCH = 120


@pytest.mark.parametrize(("dx", "dy"), [(0, 3), (0, -2), (2, 0), (-1, 0)])
def test_scroll_direction_and_amount(page: EventPage, desktop: Desktop, dx: int, dy: int) -> None:
    x, y = page.to_screen(700, 450)
    desktop.perform(a.Scroll(x=x, y=y, dx=dx, dy=dy))

    def total(events: list[dict[str, int]]) -> tuple[int, int]:
        wheels = [e for e in events if e["type"] == "wheel"]
        return sum(w["deltaX"] for w in wheels), sum(w["deltaY"] for w in wheels)

    expected = (dx * PX_PER_NOTCH, dy * PX_PER_NOTCH)
    page.wait_for(lambda es: total(es) == expected)
    assert total(page.events()) == expected
    for wheel in page.events("wheel"):
        assert (wheel["screenX"], wheel["screenY"]) == (x, y)
        assert wheel["deltaMode"] == 0


def test_scroll_with_modifier(page: EventPage, desktop: Desktop) -> None:
    x, y = page.to_screen(700, 450)
    desktop.perform(a.Scroll(x=x, y=y, dy=1, modifiers=["ctrl"]))
    wheel = page.wait_for(lambda es: [e for e in es if e["type"] == "wheel"])[0]
    assert wheel["ctrl"] is True


def a_point(x: int, y: int) -> object:
    from deskbox_server.schemas.results import Point

    return Point(x=x, y=y)
