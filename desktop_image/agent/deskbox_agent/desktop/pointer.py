"""Pointer input through XTEST: moves, buttons, wheel notches."""

from __future__ import annotations

import time

from Xlib import X
from Xlib.display import Display
from Xlib.protocol import request

from .fakeinput import FakeInput

__all__ = ["BUTTONS", "PendingSync", "Pointer"]

# A round trip started and not waited for: its reply means the X server has processed
# every request sent before it.
PendingSync = request.GetInputFocus

# X core button numbers; 8/9 are the side buttons browsers treat as back/forward.
BUTTONS: dict[str, int] = {"left": 1, "middle": 2, "right": 3, "back": 8, "forward": 9}
_REPEAT_GAP_S = 0.01
_WHEEL_UP, _WHEEL_DOWN, _WHEEL_LEFT, _WHEEL_RIGHT = 4, 5, 6, 7
# The core state mask has a bit for buttons 1-5 only (Button1Mask is 1 << 8).
_MASKED_BUTTONS = range(1, 6)
_QUICK_POLL_S, _QUICK_POLLS, _POLL_S = 0.0005, 10, 0.002


class Pointer:
    """Moves and clicks on one X connection; one caller at a time (the service's turns)."""

    def __init__(self, display: Display) -> None:
        self._display = display
        self._root = display.screen().root
        self._fake = FakeInput(display)
        self._held: set[int] = set()  # buttons we pressed and have not released

    def position(self) -> tuple[int, int]:
        reply = self._root.query_pointer()
        return int(reply.root_x), int(reply.root_y)

    def move(self, x: int, y: int) -> None:
        self._fake.send(X.MotionNotify, x=x, y=y)

    def down(self, button: str) -> None:
        self._fake.send(X.ButtonPress, BUTTONS[button])
        self._held.add(BUTTONS[button])

    def up(self, button: str) -> None:
        self._fake.send(X.ButtonRelease, BUTTONS[button])
        self._held.discard(BUTTONS[button])

    def click(self, button: str, count: int) -> None:
        for index in range(count):
            if index:
                # Clients count a repeated click only when the presses carry distinct server
                # timestamps; two presses in the same millisecond read as one click each.
                self.sync()
                time.sleep(_REPEAT_GAP_S)
            self.down(button)
            self.up(button)

    def wheel(self, dx: int, dy: int) -> None:
        vertical = _WHEEL_DOWN if dy > 0 else _WHEEL_UP
        horizontal = _WHEEL_RIGHT if dx > 0 else _WHEEL_LEFT
        for button, notches in ((vertical, abs(dy)), (horizontal, abs(dx))):
            for _ in range(notches):
                self._fake.send(X.ButtonPress, button)
                self._fake.send(X.ButtonRelease, button)

    def held_back(self) -> bool:
        """True while the X server holds back button events we sent: a button we released
        still reads as down. A synchronous grab does that (a window manager's
        click-to-focus: openbox sees the press first and lets it through to the window
        with ReplayPointer); until then the click reaches only the window manager, while
        keys sent meanwhile are delivered at once, to the window focused before it."""
        mask = int(self._root.query_pointer().mask)
        return any(mask & (X.Button1Mask << (button - 1)) and button not in self._held
                   for button in _MASKED_BUTTONS)

    def wait_let_through(self, timeout_s: float) -> None:
        """Until the X server has delivered the button events we sent (see
        :meth:`held_back`), at most ``timeout_s``: what follows goes then either way. A
        button a live viewer holds down reads the same: bounded, such keys wait
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        polls = 0
        while self.held_back():
            now = time.monotonic()
            if now >= deadline:
                return
            # Polled: nothing tells another client when a grab lets go, and the wait is
            # rare and short (the window manager's turn on a CPU).
            time.sleep(min(_QUICK_POLL_S if polls < _QUICK_POLLS else _POLL_S, deadline - now))
            polls += 1

    def sync(self) -> None:
        """One round trip: the server has generated every event we sent."""
        self._display.sync()

    def start_sync(self) -> PendingSync:
        """The round trip of :meth:`sync`, sent but not waited for (see :meth:`synced`)."""
        pending = request.GetInputFocus(display=self._display.display, defer=True)
        self._display.flush()
        return pending

    def synced(self, pending: PendingSync) -> bool:
        """Read what the server has sent, without blocking: True once ``pending``'s reply
        is in. (python-xlib 0.33, pinned: a deferred request keeps its reply in ``_data``,
        its error in ``_error``; ``pending_events`` reads without waiting.)"""
        self._display.pending_events()
        return pending._data is not None or pending._error is not None
