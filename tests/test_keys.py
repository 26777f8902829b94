"""Key names → keysyms, without a display: the aliases models emit and clear errors."""

from __future__ import annotations

import pytest
from Xlib import XK

from deskbox_server.errors import InvalidAction
from deskbox_server.keys import char_keysym, parse_combo, parse_key


@pytest.mark.parametrize(
    ("name", "keysym"),
    [
        ("Return", "Return"), ("enter", "Return"), ("ENTER", "Return"),
        ("Esc", "Escape"), ("escape", "Escape"), ("PageDown", "Next"), ("pgup", "Prior"),
        ("ArrowUp", "Up"), ("arrowleft", "Left"), ("cmd", "Super_L"), ("super", "Super_L"),
        ("meta", "Super_L"), ("win", "Super_L"), ("ctrl", "Control_L"), ("control", "Control_L"),
        ("alt", "Alt_L"), ("option", "Alt_L"), ("shift", "Shift_L"), ("F1", "F1"),
        ("f12", "F12"), ("BackSpace", "BackSpace"), ("backspace", "BackSpace"),
        ("Page_Down", "Next"), ("KP_Enter", "KP_Enter"), ("space", "space"), ("Tab", "Tab"),
    ],
)
def test_names_and_aliases(name: str, keysym: str) -> None:
    assert parse_key(name) == XK.string_to_keysym(keysym)


def test_browser_keys_from_the_xf86_group() -> None:
    assert parse_key("XF86Back") == 0x1008FF26


def test_single_characters_are_literal() -> None:
    assert parse_key("a") == ord("a")
    assert parse_key("A") == ord("A")
    assert parse_key("ñ") == 0xF1
    assert parse_key("美") == 0x01000000 + ord("美")
    assert char_keysym("\n") == XK.XK_Return


def test_combos_keep_press_order_and_the_plus_key() -> None:
    names = ["Control_L", "Shift_L", "t"]
    assert parse_combo("ctrl+shift+t") == [XK.string_to_keysym(n) for n in names]
    assert parse_combo("ctrl++") == [XK.XK_Control_L, ord("+")]
    assert parse_combo("+") == [ord("+")]
    assert parse_combo(" alt + Tab ") == [XK.XK_Alt_L, XK.XK_Tab]


@pytest.mark.parametrize("combo", ["ctrl+nosuchkey", "ctrl+", "", "  ", "hyper_drive"])
def test_unknown_or_empty_names_are_invalid_actions(combo: str) -> None:
    with pytest.raises(InvalidAction):
        parse_combo(combo)
