"""A human's input through the live view, as the actions an agent would have sent.

The VNC proxy hands over each input message a control viewer sends (RFB KeyEvent and
PointerEvent, RFC 6143 §7.5.4-5). A recording wants what the person did, not every
pointer motion: a button press and release is a ``click`` (a ``drag`` if the pointer
moved between them), wheel notches are a ``scroll``, printable keys pressed in a row are
one ``type``, and other keys (or a character with ctrl, alt or super held) a ``key`` combo.
Each is an action the API takes: keys by their X names, never a number.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from ..keys import key_name
from ..schemas.actions import MAX_TYPE_CHARS
from .keysym_chars import legacy_keysym_char

__all__ = ["HumanAction", "HumanInput"]

_KEY_EVENT, _POINTER_EVENT = 4, 5
_BUTTONS = {0: "left", 1: "middle", 2: "right", 7: "back", 8: "forward"}
# Buttons 4 to 7: a notch up, down, left, right (dx, dy).
_WHEEL = {3: (0, -1), 4: (0, 1), 5: (-1, 0), 6: (1, 0)}
_MAX_NOTCHES = 1000  # a ``scroll`` the API itself would take
_DRAG_PX = 5  # a press and release further apart than this is a drag
_MODIFIERS = {
    0xFFE1: "shift", 0xFFE2: "shift", 0xFFE3: "ctrl", 0xFFE4: "ctrl",
    0xFFE9: "alt", 0xFFEA: "alt", 0xFFE7: "alt", 0xFFE8: "alt",
    0xFFEB: "super", 0xFFEC: "super",
}
# AltGr and the like choose which character a key types, as Shift does: the character is
# what was typed (an "@" typed with AltGr was an unnamed key and then the "@").
_LEVEL_KEYSYMS = frozenset({0xFE03, 0xFE11, 0xFF7E})  # ISO_Level3/5_Shift, Mode_switch
_TYPING_GAP_S = 1.0  # a pause this long ends a ``type``
_MAX_TYPED = MAX_TYPE_CHARS  # a ``type`` the API itself would take, and no longer


@dataclass(frozen=True)
class HumanAction:
    action: dict[str, object]
    started: float  # the clock's seconds (the recorder's ``now``)
    ended: float


@dataclass
class HumanInput:
    """One viewer's input; ``emit`` gets each action once it is complete."""

    emit: Callable[[HumanAction], None]
    now: Callable[[], float]
    _mask: int = 0
    _press: tuple[int, int, float, int] | None = None  # x, y, when, button index
    _wheel: tuple[int, int, float, int, int] | None = None  # x, y, when, dx, dy
    _wheel_held: list[str] = field(default_factory=list)  # modifiers held as it began
    _held: set[str] = field(default_factory=set)
    _typed: list[str] = field(default_factory=list)
    _typed_at: tuple[float, float] = (0.0, 0.0)

    def message(self, data: bytes) -> None:
        """One whole RFB input message from the viewer."""
        if data[0] == _POINTER_EVENT and len(data) == 6:
            mask, x, y = struct.unpack_from(">BHH", data, 1)
            self._pointer(mask, x, y)
        elif data[0] == _KEY_EVENT and len(data) == 8:
            down, keysym = data[1], struct.unpack_from(">I", data, 4)[0]
            self._key(bool(down), keysym)

    def flush(self) -> None:
        """Emit what is pending (typed text, wheel notches), e.g. when the viewer leaves."""
        self._end_typing()
        self._end_wheel()

    def tick(self) -> None:
        """End a ``type`` after a pause (the recorder calls this now and then)."""
        if self._typed and self.now() - self._typed_at[1] >= _TYPING_GAP_S:
            self._end_typing()

    # -- the pointer --------------------------------------------------------------------

    def _pointer(self, mask: int, x: int, y: int) -> None:
        pressed, released = mask & ~self._mask, self._mask & ~mask
        self._mask = mask
        for bit, (dx, dy) in _WHEEL.items():
            if pressed & (1 << bit):
                self._scroll(x, y, dx, dy)
        for bit, _ in sorted(_BUTTONS.items()):
            if pressed & (1 << bit) and self._press is None:
                self._end_typing()
                self._end_wheel()
                self._press = (x, y, self.now(), bit)
            elif released & (1 << bit) and self._press is not None and self._press[3] == bit:
                self._release(x, y)

    def _release(self, x: int, y: int) -> None:
        assert self._press is not None
        x0, y0, started, bit = self._press
        self._press = None
        button = _BUTTONS[bit]
        if max(abs(x - x0), abs(y - y0)) > _DRAG_PX:
            action: dict[str, object] = {"type": "drag", "path": [[x0, y0], [x, y]],
                                         "button": button}
        else:
            action = {"type": "click", "x": x0, "y": y0, "button": button}
        if self._held:
            action["modifiers"] = sorted(self._held)
        self.emit(HumanAction(action, started, self.now()))

    def _scroll(self, x: int, y: int, dx: int, dy: int) -> None:
        now = self.now()
        if self._wheel is not None and (self._wheel[:2] != (x, y)
                                        or now - self._wheel[2] > _TYPING_GAP_S):
            self._end_wheel()
        if self._wheel is None:
            self._end_typing()
            self._wheel, self._wheel_held = (x, y, now, 0, 0), sorted(self._held)
        wx, wy, started, sum_x, sum_y = self._wheel
        self._wheel = (wx, wy, started, sum_x + dx, sum_y + dy)
        if max(abs(sum_x + dx), abs(sum_y + dy)) >= _MAX_NOTCHES:
            self._end_wheel()

    def _end_wheel(self) -> None:
        if self._wheel is not None:
            x, y, started, dx, dy = self._wheel
            self._wheel = None
            if dx or dy:
                action: dict[str, object] = {"type": "scroll", "x": x, "y": y}
                action.update({name: n for name, n in (("dx", dx), ("dy", dy)) if n})
                if self._wheel_held:
                    action["modifiers"] = self._wheel_held
                self.emit(HumanAction(action, started, self.now()))

    # -- the keyboard -------------------------------------------------------------------

    def _key(self, down: bool, keysym: int) -> None:
        if keysym in _LEVEL_KEYSYMS:
            return
        modifier = _MODIFIERS.get(keysym)
        if modifier is not None:
            if down != (modifier in self._held):
                self._end_wheel()  # ctrl+wheel (zoom) is not the wheel without ctrl
            if down:
                self._held.add(modifier)
            else:
                self._held.discard(modifier)
            return
        if not down:
            return
        char = _printable(keysym)
        if char is not None and not self._held - {"shift"}:
            now = self.now()
            self._end_wheel()
            self._typed_at = (self._typed_at[0] if self._typed else now, now)
            self._typed.append(char)
            if len(self._typed) >= _MAX_TYPED:  # a viewer that never pauses: bounded
                self._end_typing()
            return
        self._end_typing()
        self._end_wheel()
        name = char if char is not None else _name(keysym)
        keys = "+".join([*sorted(self._held - {"shift"} if char else self._held), name])
        now = self.now()
        self.emit(HumanAction({"type": "key", "keys": keys}, now, now))

    def _end_typing(self) -> None:
        if self._typed:
            text, (started, ended) = "".join(self._typed), self._typed_at
            self._typed.clear()
            self.emit(HumanAction({"type": "type", "text": text}, started, ended))


# The names of the common keys that type nothing, as models write them (X's own names
# for the rest).
_KEY_NAMES = {
    0xFF08: "BackSpace", 0xFF09: "Tab", 0xFF0D: "Return", 0xFF13: "Pause",
    0xFF1B: "Escape", 0xFF50: "Home", 0xFF51: "Left", 0xFF52: "Up", 0xFF53: "Right",
    0xFF54: "Down", 0xFF55: "Page_Up", 0xFF56: "Page_Down", 0xFF57: "End",
    0xFF61: "Print", 0xFF63: "Insert", 0xFF67: "Menu", 0xFF8D: "KP_Enter",
    0xFFE5: "Caps_Lock", 0xFFFF: "Delete",
    **{0xFFBE + n: f"F{n + 1}" for n in range(12)},
}


def _name(keysym: int) -> str:
    """The key's name as the API's ``key`` action takes it; its number only for a keysym X
    has no name for (no viewer's keyboard sends one)."""
    return _KEY_NAMES.get(keysym) or key_name(keysym) or f"0x{keysym:x}"


def _printable(keysym: int) -> str | None:
    """The character a keysym types, if it types one (Latin-1, a legacy keysym as noVNC
    sends "п" or "€", or a Unicode keysym)."""
    if 0x20 <= keysym <= 0x7E or 0xA0 <= keysym <= 0xFF:
        return chr(keysym)
    if 0x1000100 <= keysym <= 0x110FFFF:
        return chr(keysym - 0x1000000)
    return legacy_keysym_char(keysym)
