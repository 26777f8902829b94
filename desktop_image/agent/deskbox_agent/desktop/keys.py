"""Key names as models write them (xdotool style and common aliases) → X keysyms."""

from __future__ import annotations

from functools import cache

from Xlib import XK

from .errors import InvalidAction

__all__ = [
    "MODIFIER_KEYSYMS", "char_keysym", "key_name", "off_layout_char", "parse_combo", "parse_key",
]

# Names models and xdotool users emit that are not X keysym names, lower-cased.
_ALIASES: dict[str, str] = {
    "enter": "Return",
    "return": "Return",
    "esc": "Escape",
    "escape": "Escape",
    "ctrl": "Control_L",
    "control": "Control_L",
    "lctrl": "Control_L",
    "rctrl": "Control_R",
    "shift": "Shift_L",
    "lshift": "Shift_L",
    "rshift": "Shift_R",
    "alt": "Alt_L",
    "option": "Alt_L",
    "lalt": "Alt_L",
    "ralt": "Alt_R",
    "altgr": "ISO_Level3_Shift",
    "super": "Super_L",
    "win": "Super_L",
    "windows": "Super_L",
    "cmd": "Super_L",
    "command": "Super_L",
    "meta": "Super_L",
    "os": "Super_L",
    "pageup": "Prior",
    "page_up": "Prior",
    "pgup": "Prior",
    "pagedown": "Next",
    "page_down": "Next",
    "pgdn": "Next",
    "arrowup": "Up",
    "arrowdown": "Down",
    "arrowleft": "Left",
    "arrowright": "Right",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "backspace": "BackSpace",
    "bksp": "BackSpace",
    "del": "Delete",
    "delete": "Delete",
    "ins": "Insert",
    "insert": "Insert",
    "space": "space",
    "spacebar": "space",
    "tab": "Tab",
    "home": "Home",
    "end": "End",
    "capslock": "Caps_Lock",
    "caps_lock": "Caps_Lock",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "printscreen": "Print",
    "print": "Print",
    "prtsc": "Print",
    "pause": "Pause",
    "break": "Break",
    "menu": "Menu",
    "contextmenu": "Menu",
    "apps": "Menu",
    "minus": "minus",
    "plus": "plus",
    "equal": "equal",
    "comma": "comma",
    "period": "period",
    "slash": "slash",
    "backslash": "backslash",
    "semicolon": "semicolon",
    "quote": "apostrophe",
    "apostrophe": "apostrophe",
    "grave": "grave",
    "backtick": "grave",
    "bracketleft": "bracketleft",
    "bracketright": "bracketright",
    "volumeup": "XF86AudioRaiseVolume",
    "volumedown": "XF86AudioLowerVolume",
    "volumemute": "XF86AudioMute",
}

ISO_LEVEL3_SHIFT = 0xFE03
MODIFIER_KEYSYMS: frozenset[int] = frozenset(
    (
        XK.XK_Shift_L, XK.XK_Shift_R, XK.XK_Control_L, XK.XK_Control_R, XK.XK_Alt_L,
        XK.XK_Alt_R, XK.XK_Super_L, XK.XK_Super_R, XK.XK_Meta_L, XK.XK_Meta_R, ISO_LEVEL3_SHIFT,
    )
)


@cache
def _keysyms_by_lower_name() -> dict[str, int]:
    """Every keysym name python-xlib knows, lower-cased ("page_down" → Page_Down)."""
    # Loaded on first use, not at import: media and browser keys (XF86Back, XF86AudioMute).
    XK.load_keysym_group("xf86")
    XK.load_keysym_group("xkb")
    table: dict[str, int] = {}
    for name in dir(XK):
        if name.startswith("XK_"):
            keysym_name = name[3:]
            table.setdefault(keysym_name.lower(), getattr(XK, name))
            if keysym_name.startswith("XF86_"):
                # python-xlib spells XF86Back as XF86_Back; accept the X spelling too.
                table.setdefault("xf86" + keysym_name[5:].lower(), getattr(XK, name))
    return table


@cache
def _names_by_keysym() -> dict[int, str]:
    """A name of each keysym python-xlib knows (the first in its order), as parse_key takes it."""
    _keysyms_by_lower_name()  # loads the groups
    names: dict[int, str] = {}
    for name in dir(XK):
        if name.startswith("XK_"):
            names.setdefault(getattr(XK, name), name[3:])
    return names


def key_name(keysym: int) -> str | None:
    """The X name of ``keysym`` (Num_Lock, KP_1, XF86_Back), which :func:`parse_key` turns
    back into it; None for a keysym without one."""
    return _names_by_keysym().get(keysym)


def char_keysym(char: str) -> int:
    """The keysym that produces ``char``: Latin-1 maps directly, the rest to 0x1000000+U."""
    code = ord(char)
    if char == "\n":
        return XK.XK_Return
    if char == "\t":
        return XK.XK_Tab
    if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF:
        return code
    return 0x01000000 + code


def off_layout_char(keysym: int) -> bool:
    """Whether ``keysym`` types a character a US layout has no key for: Latin-1's upper
    half, the legacy character sets (0x100-0xFDFF, not the dead and function keys above)
    and Unicode's (0x1000000 + U, from U+00A0)."""
    return 0xA0 <= keysym <= 0xFDFF or 0x010000A0 <= keysym <= 0x0110FFFF


def parse_key(name: str) -> int:
    """One key name → keysym. Single characters are taken literally ("A" is shifted a)."""
    if not name:
        raise InvalidAction("empty key name (look for a doubled or trailing '+')")
    if len(name) == 1:
        return char_keysym(name)
    by_lower_name = _keysyms_by_lower_name()
    alias = _ALIASES.get(name.lower())
    if alias is not None:
        return by_lower_name[alias.lower()]
    exact = XK.string_to_keysym(name)
    if exact:
        return int(exact)
    folded = by_lower_name.get(name.lower())
    if folded is not None:
        return folded
    raise InvalidAction(f"unknown key name {name!r}")


def parse_combo(keys: str) -> list[int]:
    """"ctrl+shift+t" → keysyms in press order. A lone "+" (or a trailing "++") is the plus key."""
    text = keys.strip()
    if not text:
        raise InvalidAction("empty key combination")
    if text == "+":
        return [parse_key("+")]
    parts = text.split("+")
    if text.endswith("++"):
        parts = [*parts[:-2], "+"]
    return [parse_key(part.strip()) for part in parts]
