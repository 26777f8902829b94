"""Typing and key combinations arrive in the page as real key events, exactly."""

from __future__ import annotations

import pytest

from deskbox_server.driver.desktop import Desktop
from deskbox_server.schemas import actions as a

from .conftest import EventPage

UNICODE_SAMPLE = "Ñandú — 美しい 👍"


@pytest.mark.parametrize(
    "text",
    [
        "Hello, World! 0123456789",
        "~!@#$%^&*()_+{}|:\"<>? `-=[]\\;',./",
        UNICODE_SAMPLE,
        "Grüße, ça va? Ωμέγα Привет ✓",
        "two\nlines",
    ],
)
def test_type_puts_exact_text_in_the_field(page: EventPage, desktop: Desktop, text: str) -> None:
    page.focus_field()
    desktop.perform(a.TypeText(text=text))
    page.wait_for(lambda _: page.value() == text)
    assert page.value() == text


def test_typed_characters_are_key_events(page: EventPage, desktop: Desktop) -> None:
    page.focus_field()
    desktop.perform(a.TypeText(text="aÑ👍"))
    page.wait_for(lambda _: page.value() == "aÑ👍")
    # One key press per character, each inserting exactly its character. (Chromium names the
    # key of a borrowed keycode from a keymap it reloads late, so keydown.key is not checked.)
    assert len(page.events("keydown")) == len(page.events("keyup")) == 3
    assert [e["data"] for e in page.events("input")] == ["a", "Ñ", "👍"]


def test_keyboard_layout_is_restored_after_typing(page: EventPage, desktop: Desktop) -> None:
    page.focus_field()
    desktop.perform(a.TypeText(text="美"))
    desktop.perform(a.TypeText(text="abc"))
    page.wait_for(lambda _: page.value() == "美abc")
    assert page.value() == "美abc"
    assert desktop.keyboard._spare_keycodes_are_empty()  # noqa: SLF001 (checks the X mapping)


def test_ctrl_a_then_typing_replaces_the_text(page: EventPage, desktop: Desktop) -> None:
    page.focus_field()
    desktop.perform(a.TypeText(text="old text"))
    desktop.perform(a.Key(keys="ctrl+a"))
    desktop.perform(a.TypeText(text="new"))
    page.wait_for(lambda _: page.value() == "new")
    assert page.value() == "new"


@pytest.mark.parametrize(
    ("keys", "key", "code"),
    [
        ("Return", "Enter", "Enter"),
        ("enter", "Enter", "Enter"),
        ("Escape", "Escape", "Escape"),
        ("esc", "Escape", "Escape"),
        ("PageDown", "PageDown", "PageDown"),
        ("Page_Up", "PageUp", "PageUp"),
        ("ArrowUp", "ArrowUp", "ArrowUp"),
        ("Left", "ArrowLeft", "ArrowLeft"),
        ("BackSpace", "Backspace", "Backspace"),
        ("Tab", "Tab", "Tab"),
        ("F2", "F2", "F2"),
        ("f9", "F9", "F9"),
        ("Home", "Home", "Home"),
        ("Delete", "Delete", "Delete"),
        ("space", " ", "Space"),
    ],
)
def test_key_names_and_aliases(
    page: EventPage, desktop: Desktop, keys: str, key: str, code: str
) -> None:
    page.focus_field()
    desktop.perform(a.Key(keys=keys))
    page.wait_for(lambda es: {"keydown", "keyup"} <= {e["type"] for e in es})
    assert [(e["key"], e["code"]) for e in page.events("keydown")] == [(key, code)]
    assert [(e["key"], e["code"]) for e in page.events("keyup")] == [(key, code)]


@pytest.mark.parametrize(
    ("keys", "flags", "key"),
    [
        ("ctrl+shift+k", {"ctrl", "shift"}, "K"),
        ("alt+x", {"alt"}, "x"),
        ("cmd+b", {"meta"}, "b"),
        ("super+b", {"meta"}, "b"),
        ("control+ArrowLeft", {"ctrl"}, "ArrowLeft"),
    ],
)
def test_key_combos_hold_modifiers(
    page: EventPage, desktop: Desktop, keys: str, flags: set[str], key: str
) -> None:
    page.focus_field()
    desktop.perform(a.Key(keys=keys))
    page.wait_for(lambda es: len([e for e in es if e["type"] == "keyup"]) >= len(keys.split("+")))
    main = [e for e in page.events("keydown") if e["key"] == key]
    assert len(main) == 1
    held = {name for name in ("ctrl", "shift", "alt", "meta") if main[0][name]}
    assert held == flags
    # Everything pressed was released.
    assert len(page.events("keyup")) == len(page.events("keydown"))


def test_hold_key_holds_for_the_duration(page: EventPage, desktop: Desktop) -> None:
    page.focus_field()
    desktop.perform(a.HoldKey(keys="shift", duration_s=0.3))
    up = page.wait_for(lambda es: [e for e in es if e["type"] == "keyup"])[0]
    down = page.events("keydown")[0]
    assert down["key"] == up["key"] == "Shift"
    assert up["t"] - down["t"] >= 280


def test_shift_is_released_after_a_shifted_run(page: EventPage, desktop: Desktop) -> None:
    page.focus_field()
    desktop.perform(a.TypeText(text="ABC!"))
    desktop.perform(a.TypeText(text="d"))
    page.wait_for(lambda _: page.value() == "ABC!d")
    assert page.value() == "ABC!d"
    shift_downs = [e for e in page.events("keydown") if e["key"] == "Shift"]
    assert len(shift_downs) == 1  # held across the run, not pressed per character


def test_keys_right_after_a_click_go_where_the_click_put_the_focus(
    page: EventPage, desktop: Desktop
) -> None:
    """A key must not overtake the click before it (Chromium hit-tests clicks asynchronously)."""
    x, y = page.to_screen(900, 175)
    elsewhere = page.to_screen(500, 450)
    for attempt in range(8):
        page.cdp.evaluate(f"document.getElementById('field').value = 'old {attempt}'")
        desktop.perform(a.Click(x=elsewhere[0], y=elsewhere[1]))  # focus leaves the field
        desktop.run(
            [a.Click(x=x, y=y), a.Key(keys="ctrl+a"), a.TypeText(text=f"new {attempt}")]
        )
        page.wait_for(lambda _, n=attempt: page.value() == f"new {n}", 2.0)
        assert page.value() == f"new {attempt}"
