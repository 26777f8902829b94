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


class Pointer:
    """Moves and clicks on one X connection; one caller at a time (the service's turns)."""

    def __init__(self, display: Display) -> None:
        self._display = display
        self._root = display.screen().root
        self._fake = FakeInput(display)

    def position(self) -> tuple[int, int]:
        reply = self._root.query_pointer()
        return int(reply.root_x), int(reply.root_y)

    def move(self, x: int, y: int) -> None:
        self._fake.send(X.MotionNotify, x=x, y=y)

    def down(self, button: str) -> None:
        self._fake.send(X.ButtonPress, BUTTONS[button])

    def up(self, button: str) -> None:
        self._fake.send(X.ButtonRelease, BUTTONS[button])

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
