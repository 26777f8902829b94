"""Keyboard input through XTEST, with any Unicode character typeable.

A character the current layout has no key for is given a spare keycode (one the layout
leaves empty): every character arrives as a real key press, so pages see
keydown/keypress/input events. The keycode stays lent after the typing, so that the same
character typed again costs no change of the layout: every change makes each client
re-read the table, and giving a keycode back or lending it to another character must wait
until the keys typed on it have been read (Keyboard._borrow). Beyond
:data:`KEPT_BORROWINGS`, lendings are given back once the desktop is idle
(:meth:`Keyboard.give_back_extra`), so that programs in the session still find spare
keycodes of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

from Xlib import XK, X
from Xlib.display import Display

from .errors import InvalidAction
from .fakeinput import FakeInput
from .keys import char_keysym, parse_combo

__all__ = ["KEPT_BORROWINGS", "Keyboard"]

_SHIFT = XK.XK_Shift_L
_MAPPING_GRACE_S = 0.1  # only where the X server has no RECORD extension
# Keycodes lent to characters that stay lent once an action is done (Xvfb's US layout
# leaves 19 empty; xdotool and x11vnc borrow from the same ones).
KEPT_BORROWINGS = 8


class Keyboard:
    """Presses keys on one X connection; one caller at a time (the service's turns)."""

    def __init__(
        self,
        display: Display,
        await_delivery: Callable[[float], object] | None = None,
        await_reread: Callable[[float], object] | None = None,
    ) -> None:
        """``await_delivery(typed_at)`` returns once clients have handled the keys sent at
        or before ``typed_at`` (the desktop waits for the screen to settle);
        ``await_reread(since)`` once clients have re-read a mapping changed at ``since``
        (the desktop watches with RECORD). Both default to a fixed grace period."""
        self._display = display
        self._fake_input = FakeInput(display)
        self._await_delivery = await_delivery or (lambda _typed_at: time.sleep(_MAPPING_GRACE_S))
        self._await_reread = await_reread or (lambda _since: time.sleep(_MAPPING_GRACE_S))
        self._min_keycode: int = display.display.info.min_keycode
        self._max_keycode: int = display.display.info.max_keycode
        self._stale = True
        self._rows: list[tuple[int, ...]] = []
        self._by_keysym: dict[int, tuple[int, bool]] = {}
        self._spare: list[int] = []
        # keysym → the spare keycode lent to it, least recently typed first.
        self._borrowed: dict[int, int] = {}
        # lent keycode → time.monotonic() of the last key event sent on it (0: none yet).
        self._typed_at: dict[int, float] = {}

    def mapping_changed(self) -> None:
        """Someone (a program in the session, or we) changed the layout: re-read it lazily."""
        self._stale = True

    def _refresh(self) -> None:
        if not self._stale:
            return
        count = self._max_keycode - self._min_keycode + 1
        rows = self._display.get_keyboard_mapping(self._min_keycode, count)
        self._rows = [tuple(row) for row in rows]
        # A lending someone else's change of the layout overwrote is no longer ours.
        self._borrowed = {
            keysym: keycode for keysym, keycode in self._borrowed.items()
            if self._rows[keycode - self._min_keycode][:2] == (keysym, keysym)
        }
        lent = set(self._borrowed.values())
        self._typed_at = {k: at for k, at in self._typed_at.items() if k in lent}
        by_keysym: dict[int, tuple[int, bool]] = {}
        spare: list[int] = []
        for offset, row in enumerate(rows):
            keycode = self._min_keycode + offset
            syms = list(row)
            if keycode in lent:
                continue
            if not any(syms):
                spare.append(keycode)
                continue
            for level, keysym in enumerate(syms[:2]):
                if keysym and keysym not in by_keysym:
                    by_keysym[keysym] = (keycode, level == 1)
        self._by_keysym = by_keysym
        # Highest first: low keycodes are the ones layouts and programs reach for.
        self._spare = sorted(spare, reverse=True)
        self._stale = False

    def _fake(self, event_type: int, keycode: int) -> None:
        self._fake_input.send(event_type, keycode)
        if keycode in self._typed_at:
            self._typed_at[keycode] = time.monotonic()

    def _tap_all(self, keys: Sequence[tuple[int, bool | None]]) -> None:
        """Press and release each (keycode, needs shift) in turn.

        Shift stays down across a run of shifted characters rather than going down and up
        around each one: half the key events for upper-case words and symbols. ``None``
        means the key types the same with or without Shift (a borrowed keycode).
        """
        shift = self._by_keysym[_SHIFT][0]
        shift_down = False
        try:
            for keycode, shifted in keys:
                if shifted is not None and shifted != shift_down:
                    self._fake(X.KeyPress if shifted else X.KeyRelease, shift)
                    shift_down = shifted
                self._fake(X.KeyPress, keycode)
                self._fake(X.KeyRelease, keycode)
        finally:
            if shift_down:
                self._fake(X.KeyRelease, shift)

    def _borrow(self, keysyms: Iterable[int]) -> dict[int, int]:
        """The keycode of each keysym the layout has no key for: lent before, or lent now.

        A new lending rewrites the table and waits until the clients have re-read it
        (Chromium fetches a changed table asynchronously and translates the keys it reads
        meanwhile with the old one). When the spare keycodes are all lent, the least
        recently typed characters not wanted now give theirs up, once the keys typed on them
        have shown on screen (no wait if that was long ago): a client translates a key with
        the mapping it knows when it reads the event, and a busy Chromium reads the last
        keys and the change in one batch, so they would come out as the new character."""
        wanted = [k for k in dict.fromkeys(keysyms) if k not in self._by_keysym]
        if len(wanted) > len(self._spare) + len(self._borrowed):
            raise InvalidAction(
                f"{len(wanted)} distinct characters have no key; at most "
                f"{len(self._spare) + len(self._borrowed)} can be typed in one go"
            )
        missing = [k for k in wanted if k not in self._borrowed]
        if missing:
            free = list(self._spare)
            keep = set(wanted)
            rows = list(self._rows)
            if len(missing) > len(free):
                # The capacity check above leaves enough to take back.
                taken = [k for k in self._borrowed if k not in keep][: len(missing) - len(free)]
                self._await_delivery(self._last_typed(taken))
                # Each keycode taken back is lent again below: its row is rewritten there,
                # not emptied here.
                free.extend(self._borrowed.pop(keysym) for keysym in taken)
            for keysym, keycode in zip(missing, free, strict=False):
                # Both levels: a viewer's Shift may be down (tap_keysym).
                rows[keycode - self._min_keycode] = (keysym, keysym) + (X.NoSymbol,) * (
                    len(rows[0]) - 2)
                self._borrowed[keysym] = keycode
                self._typed_at[keycode] = 0.0
            since = time.monotonic()
            self._write_mapping(rows)
            self._await_reread(since)
        for keysym in wanted:  # most recently typed last
            self._borrowed[keysym] = self._borrowed.pop(keysym)
        return {keysym: self._borrowed[keysym] for keysym in wanted}

    @property
    def lends_extra(self) -> bool:
        """More than :data:`KEPT_BORROWINGS` keycodes are lent (as far as we know)."""
        return len(self._borrowed) > KEPT_BORROWINGS

    def _last_typed(self, keysyms: Iterable[int]) -> float:
        """When a key was last sent on the keycodes lent to ``keysyms``."""
        return max((self._typed_at.get(self._borrowed[k], 0.0) for k in keysyms), default=0.0)

    def give_back_extra(self, read: Callable[[float], bool]) -> None:
        """Beyond :data:`KEPT_BORROWINGS`, the least recently typed characters give their
        keycodes back if ``read(typed_at)`` says that the keys last typed on them, at
        ``typed_at``, have been read (see :meth:`_borrow` for the race). The desktop calls
        this once it is idle, not at the end of each action: a text of more distinct
        characters off the layout than stay lent (a Chinese sentence) would wait for its
        keys to be read each time it is typed."""
        self._stale = True  # a table another client changed meanwhile is kept as it is now
        self._refresh()
        extra = list(self._borrowed)[: max(0, len(self._borrowed) - KEPT_BORROWINGS)]
        if not extra or not read(self._last_typed(extra)):
            return
        rows = list(self._rows)
        for keysym in extra:
            keycode = self._borrowed.pop(keysym)
            del self._typed_at[keycode]
            rows[keycode - self._min_keycode] = (X.NoSymbol,) * len(rows[0])
        self._write_mapping(rows)

    def _write_mapping(self, rows: list[tuple[int, ...]]) -> None:
        """Replace the whole table in one request.

        Clients such as Chromium take the keycode range of a MappingNotify as the keyboard's
        new range: changing one keycode alone would leave them with a one-key keyboard.
        """
        self._display.change_keyboard_mapping(self._min_keycode, rows)
        self._display.sync()
        self._rows = rows  # what the X server has now, until its MappingNotify says stale
        self._stale = True

    def _chunks(self, keysyms: Sequence[int]) -> Iterator[Sequence[int]]:
        """Split a text so that no chunk needs more keysyms off the layout than there are
        keycodes to lend (the spare ones and those lent already)."""
        start = 0
        needed: set[int] = set()
        capacity = len(self._spare) + len(self._borrowed)
        for index, keysym in enumerate(keysyms):
            if keysym not in self._by_keysym and keysym not in needed:
                if len(needed) == capacity:
                    yield keysyms[start:index]
                    start, needed = index, set()
                needed.add(keysym)
        yield keysyms[start:]

    def tap_keysym(self, keysym: int) -> None:
        """Press and release the key of ``keysym`` (a borrowed keycode when the layout has
        none: on both levels, as a live viewer's Shift may be down)."""
        self._refresh()
        keycode = self._borrow([keysym]).get(keysym) or self._by_keysym[keysym][0]
        self._fake(X.KeyPress, keycode)
        self._fake(X.KeyRelease, keycode)
        self._display.sync()

    def type_text(self, text: str) -> None:
        self._refresh()
        # Every spelling of a line break is one Return: \r\n (Windows) and a lone \r
        # (old Mac text, or a model that ends its lines so) as \n is.
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        keysyms = [char_keysym(char) for char in text]
        for chunk in self._chunks(keysyms):
            self._refresh()
            lent = self._borrow(chunk)
            self._tap_all(
                [
                    (lent[keysym], None) if keysym in lent else self._by_keysym[keysym]
                    for keysym in chunk
                ]
            )
            self._display.sync()

    def _combo_keycodes(self, keys: str, assigned: dict[int, int]) -> list[int]:
        keycodes: list[int] = []
        for keysym in parse_combo(keys):
            if keysym in assigned:
                keycodes.append(assigned[keysym])
                continue
            keycode, shifted = self._by_keysym[keysym]
            if shifted and self._by_keysym[_SHIFT][0] not in keycodes:
                keycodes.append(self._by_keysym[_SHIFT][0])
            keycodes.append(keycode)
        return keycodes

    @contextmanager
    def held(self, keys: str | Sequence[str]) -> Iterator[None]:
        """Hold one combination ("ctrl+shift") or several key names down while inside."""
        combo = keys if isinstance(keys, str) else "+".join(keys)
        if not combo:
            yield
            return
        self._refresh()
        keycodes = self._combo_keycodes(combo, self._borrow(parse_combo(combo)))
        pressed: list[int] = []
        try:
            for keycode in keycodes:
                self._fake(X.KeyPress, keycode)
                pressed.append(keycode)
            self._display.sync()
            yield
        finally:
            for keycode in reversed(pressed):
                self._fake(X.KeyRelease, keycode)
            self._display.sync()

    def validate(self, keys: str | Sequence[str]) -> None:
        """Raise InvalidAction for unknown names before any key goes down."""
        combo = keys if isinstance(keys, str) else "+".join(keys)
        if combo:
            parse_combo(combo)

    def press(self, keys: str) -> None:
        with self.held(keys):
            pass

    def hold(self, keys: str, duration_s: float) -> None:
        with self.held(keys):
            # Holding for a duration is the action itself; this runs on the worker thread.
            time.sleep(duration_s)
