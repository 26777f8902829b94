"""The actions the agent accepts, parsed from the request's JSON into frozen dataclasses.

The field names and bounds are those of the server's public schema
(``server/deskbox_server/schemas/actions.py``), discriminated by ``type``. The host
validates that contract first; this parser only has to be correct and bounded, so that
nothing a caller sends can make the desktop work without limit. A bad object raises
:class:`InvalidAction` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, cast

from .errors import InvalidAction

__all__ = [
    "MAX_ACTIONS",
    "Action",
    "ClipboardGet",
    "ClipboardSet",
    "Click",
    "CursorPosition",
    "Drag",
    "HoldKey",
    "Key",
    "MouseDown",
    "MouseUp",
    "Move",
    "Region",
    "ScaleTo",
    "ScreenSize",
    "Screenshot",
    "Scroll",
    "SettleOptions",
    "TypeText",
    "View",
    "Wait",
    "Zoom",
    "parse_action",
    "parse_actions",
    "parse_screenshot",
    "parse_settle",
    "parse_view",
]

MAX_ACTIONS = 1000
MAX_TYPE_CHARS = 20_000
MAX_CLIPBOARD_CHARS = 200_000
MAX_WAIT_MS = 60_000
MAX_HOLD_S = 30.0
MAX_DRAG_POINTS = 10_000
MAX_SIDE = 16_384
MAX_PIXELS = 7680 * 4320
MAX_KEYS = 200
MAX_MODIFIERS = 8

Button = Literal["left", "right", "middle", "back", "forward"]
ImageFormat = Literal["png", "jpeg", "webp"]
_BUTTONS = ("left", "right", "middle", "back", "forward")
_FORMATS = ("png", "jpeg", "webp")


@dataclass(frozen=True)
class Region:
    x: int
    y: int
    width: int
    height: int


@dataclass(frozen=True)
class ScaleTo:
    width: int
    height: int


@dataclass(frozen=True)
class View:
    """The W×H space a model sees; coordinates and screenshots are mapped to and from it."""

    width: int
    height: int


@dataclass(frozen=True)
class Screenshot:
    format: ImageFormat = "jpeg"
    quality: int = 75
    region: Region | None = None
    scale: ScaleTo | None = None
    cursor: bool = False


@dataclass(frozen=True)
class Click:
    x: int | None = None
    y: int | None = None
    button: Button = "left"
    count: int = 1
    modifiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Move:
    x: int
    y: int
    modifiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class MouseDown:
    button: Button = "left"
    x: int | None = None
    y: int | None = None


@dataclass(frozen=True)
class MouseUp:
    button: Button = "left"
    x: int | None = None
    y: int | None = None


@dataclass(frozen=True)
class Drag:
    path: tuple[tuple[int, int], ...]
    button: Button = "left"
    modifiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scroll:
    x: int | None = None
    y: int | None = None
    dx: int = 0
    dy: int = 0
    modifiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class TypeText:
    text: str


@dataclass(frozen=True)
class Key:
    keys: str


@dataclass(frozen=True)
class HoldKey:
    keys: str
    duration_s: float


@dataclass(frozen=True)
class Wait:
    ms: int


@dataclass(frozen=True)
class CursorPosition:
    pass


@dataclass(frozen=True)
class ScreenSize:
    pass


@dataclass(frozen=True)
class Zoom:
    region: Region
    scale: ScaleTo | None = None
    format: ImageFormat = "png"
    quality: int = 75


@dataclass(frozen=True)
class ClipboardGet:
    pass


@dataclass(frozen=True)
class ClipboardSet:
    text: str


Action: TypeAlias = (
    Screenshot | Click | Move | MouseDown | MouseUp | Drag | Scroll | TypeText | Key | HoldKey
    | Wait | CursorPosition | ScreenSize | Zoom | ClipboardGet | ClipboardSet
)


@dataclass(frozen=True)
class SettleOptions:
    """The screen counts as settled after ``quiet_s`` without damage (at most ``timeout_s``).

    The defaults are the driver's (server/deskbox_server/driver/desktop.py).
    """

    quiet_s: float = 0.1
    timeout_s: float = 2.0
    drag_step_s: float = 0.02
    # Keys right after a button event wait until the X server has let it through (a window
    # manager's click-to-focus holds it) and the screen has been quiet this long since it
    # (given up 0.12 s later on a screen that keeps changing): Desktop._let_buttons_land.
    click_to_key_s: float = 0.03
    # How long the screen must stay unchanged after typing on lent keycodes before one is
    # given back or lent to another character (Keyboard._borrow).
    typing_quiet_s: float = 0.2


# -- the parser -------------------------------------------------------------------------

_REQUIRED: object = object()
_REQUIRED_NUMBER: object = object()


class _Fields:
    """Reads the fields of one JSON object, naming ``where`` in every refusal."""

    def __init__(self, value: object, where: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(value, dict):
            raise InvalidAction(f"{where}: expected an object, got {_kind(value)}")
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            raise InvalidAction(f"{where}: unknown field {unknown[0][:64]!r}")
        self.value = cast(dict[str, object], value)
        self.where = where

    def _get(self, name: str, default: object) -> object:
        if name not in self.value:
            if default is _REQUIRED:
                raise InvalidAction(f"{self.where}: {name} is required")
            return default
        return self.value[name]

    def integer(self, name: str, lo: int, hi: int, default: object = None) -> Any:
        value = self._get(name, default)
        if value is None and default is None:
            return None
        if type(value) is not int or not lo <= value <= hi:
            raise InvalidAction(f"{self.where}: {name} must be an integer in [{lo}, {hi}]")
        return value

    def number(self, name: str, lo: float, hi: float, default: object = _REQUIRED_NUMBER) -> Any:
        value = self._get(name, _REQUIRED if default is _REQUIRED_NUMBER else default)
        if (type(value) not in (int, float) or not math.isfinite(cast(float, value))
                or not lo <= cast(float, value) <= hi):
            raise InvalidAction(f"{self.where}: {name} must be a number in [{lo}, {hi}]")
        return float(cast(float, value))

    def text(self, name: str, max_len: int, min_len: int = 0, default: object = None) -> Any:
        value = self._get(name, _REQUIRED if default is None else default)
        if not isinstance(value, str) or not min_len <= len(value) <= max_len:
            raise InvalidAction(
                f"{self.where}: {name} must be a string of {min_len} to {max_len} characters")
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> Any:
        value = self._get(name, default)
        if value not in choices:
            raise InvalidAction(f"{self.where}: {name} must be one of {', '.join(choices)}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        if type(value) is not bool:
            raise InvalidAction(f"{self.where}: {name} must be true or false")
        return value

    def modifiers(self) -> tuple[str, ...]:
        value = self._get("modifiers", [])
        if (not isinstance(value, list) or len(value) > MAX_MODIFIERS
                or not all(isinstance(m, str) and 0 < len(m) <= 64 for m in value)):
            raise InvalidAction(
                f"{self.where}: modifiers must be a list of at most {MAX_MODIFIERS} key names")
        return tuple(cast(list[str], value))

    def object(self, name: str, parse: Callable[[object, str], Any], required: bool) -> Any:
        value = self._get(name, _REQUIRED if required else None)
        return None if value is None else parse(value, f"{self.where}.{name}")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _region(value: object, where: str) -> Region:
    f = _Fields(value, where, ("x", "y", "width", "height"))
    return Region(f.integer("x", 0, MAX_SIDE, _REQUIRED), f.integer("y", 0, MAX_SIDE, _REQUIRED),
                  f.integer("width", 1, MAX_SIDE, _REQUIRED),
                  f.integer("height", 1, MAX_SIDE, _REQUIRED))


def _size(value: object, where: str) -> tuple[int, int]:
    f = _Fields(value, where, ("width", "height"))
    width = f.integer("width", 1, MAX_SIDE, _REQUIRED)
    height = f.integer("height", 1, MAX_SIDE, _REQUIRED)
    if width * height > MAX_PIXELS:
        raise InvalidAction(f"{where}: {width}x{height} is more than {MAX_PIXELS} pixels")
    return width, height


def _scale(value: object, where: str) -> ScaleTo:
    return ScaleTo(*_size(value, where))


def parse_view(value: object, where: str = "view") -> View | None:
    return None if value is None else View(*_size(value, where))


def _screenshot(f: _Fields) -> Screenshot:
    return Screenshot(
        format=f.choice("format", _FORMATS, "jpeg"), quality=f.integer("quality", 1, 100, 75),
        region=f.object("region", _region, False), scale=f.object("scale", _scale, False),
        cursor=f.flag("cursor", False))


def parse_screenshot(value: object, where: str = "screenshot") -> Screenshot | None:
    if value is None:
        return None
    f = _Fields(value, where, ("type", "format", "quality", "region", "scale", "cursor"))
    if f.value.get("type", "screenshot") != "screenshot":
        raise InvalidAction(f"{where}: type must be 'screenshot'")
    return _screenshot(f)


def _point(value: object, where: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(type(c) is int and 0 <= c <= MAX_SIDE for c in value)):
        raise InvalidAction(f"{where}: a point is [x, y], integers in [0, {MAX_SIDE}]")
    return value[0], value[1]


def _path(f: _Fields) -> tuple[tuple[int, int], ...]:
    value = f._get("path", _REQUIRED)
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_DRAG_POINTS:
        raise InvalidAction(f"{f.where}: path must be a list of 2 to {MAX_DRAG_POINTS} points")
    return tuple(_point(p, f"{f.where}.path[{i}]") for i, p in enumerate(value))


_COORD = (0, MAX_SIDE)
_PARSERS: dict[str, tuple[tuple[str, ...], Callable[[_Fields], Action]]] = {
    "screenshot": (("format", "quality", "region", "scale", "cursor"), _screenshot),
    "click": (("x", "y", "button", "count", "modifiers"), lambda f: Click(
        f.integer("x", *_COORD), f.integer("y", *_COORD), f.choice("button", _BUTTONS, "left"),
        f.integer("count", 1, 3, 1), f.modifiers())),
    "move": (("x", "y", "modifiers"), lambda f: Move(
        f.integer("x", *_COORD, _REQUIRED), f.integer("y", *_COORD, _REQUIRED), f.modifiers())),
    "mouse_down": (("button", "x", "y"), lambda f: MouseDown(
        f.choice("button", _BUTTONS, "left"), f.integer("x", *_COORD), f.integer("y", *_COORD))),
    "mouse_up": (("button", "x", "y"), lambda f: MouseUp(
        f.choice("button", _BUTTONS, "left"), f.integer("x", *_COORD), f.integer("y", *_COORD))),
    "drag": (("path", "button", "modifiers"), lambda f: Drag(
        _path(f), f.choice("button", _BUTTONS, "left"), f.modifiers())),
    "scroll": (("x", "y", "dx", "dy", "modifiers"), lambda f: Scroll(
        f.integer("x", *_COORD), f.integer("y", *_COORD), f.integer("dx", -1000, 1000, 0),
        f.integer("dy", -1000, 1000, 0), f.modifiers())),
    "type": (("text",), lambda f: TypeText(f.text("text", MAX_TYPE_CHARS))),
    "key": (("keys",), lambda f: Key(f.text("keys", MAX_KEYS, 1))),
    "hold_key": (("keys", "duration_s"), lambda f: HoldKey(
        f.text("keys", MAX_KEYS, 1), f.number("duration_s", 0.0, MAX_HOLD_S))),
    "wait": (("ms",), lambda f: Wait(f.integer("ms", 0, MAX_WAIT_MS, _REQUIRED))),
    "cursor_position": ((), lambda f: CursorPosition()),
    "screen_size": ((), lambda f: ScreenSize()),
    "zoom": (("region", "scale", "format", "quality"), lambda f: Zoom(
        f.object("region", _region, True), f.object("scale", _scale, False),
        f.choice("format", _FORMATS, "png"), f.integer("quality", 1, 100, 75))),
    "clipboard_get": ((), lambda f: ClipboardGet()),
    "clipboard_set": (("text",), lambda f: ClipboardSet(f.text("text", MAX_CLIPBOARD_CHARS))),
}


def parse_action(value: object, where: str = "action") -> Action:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str) or kind not in _PARSERS:
        known = ", ".join(_PARSERS)
        shown = repr(kind[:32]) if isinstance(kind, str) else _kind(kind)
        raise InvalidAction(f"{where}: type must be one of {known} (got {shown})")
    fields, parse = _PARSERS[kind]
    return parse(_Fields(value, where, ("type", *fields)))


def parse_actions(value: object) -> list[Action]:
    if not isinstance(value, list) or len(value) > MAX_ACTIONS:
        raise InvalidAction(f"actions must be a list of at most {MAX_ACTIONS} actions")
    return [parse_action(item, f"actions[{i}]") for i, item in enumerate(value)]


def parse_settle(value: object, where: str = "settle") -> SettleOptions | None:
    if value is None:
        return None
    names = ("quiet_s", "timeout_s", "drag_step_s", "click_to_key_s", "typing_quiet_s")
    f = _Fields(value, where, names)
    d = SettleOptions()
    return SettleOptions(
        quiet_s=f.number("quiet_s", 0.0, 10.0, d.quiet_s),
        timeout_s=f.number("timeout_s", 0.0, 30.0, d.timeout_s),
        drag_step_s=f.number("drag_step_s", 0.0, 1.0, d.drag_step_s),
        click_to_key_s=f.number("click_to_key_s", 0.0, 1.0, d.click_to_key_s),
        typing_quiet_s=f.number("typing_quiet_s", 0.0, 5.0, d.typing_quiet_s),
    )


def json_fields(value: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    """Refuse unknown top-level fields of a call's request."""
    _Fields(dict(value), where, allowed)
