"""Frames of the whole screen, one each time it changed: the ``watch`` call.

A session's recording asks again and again; each answer comes as soon as the screen
changed since the last one's capture, so a still screen costs no capture, no encoding and
no bytes. The change is the X server's DAMAGE on the root window (ReportNonEmpty: one
event when the region goes from empty to not, none after until we subtract), read on a
connection and a thread of the watch's own, so that its long waits never hold up the
desktop's worker. Waits are on that connection's fd (and a wake-up pipe, so that a
cancelled call or the service closing ends a wait at once), never a sleep loop.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from contextlib import suppress

from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, DisplayError, XError
from Xlib.ext import damage
from Xlib.protocol.rq import Event

from .capture import Capturer
from .encode import EncodedImage, encode
from .errors import DesktopFailed
from .xwait import drain_events

__all__ = ["Wake", "Watch"]

_X_ERRORS = (ConnectionClosedError, XError, OSError)


class Wake:
    """A pipe another thread writes to, so that a watch's ``select`` returns now."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self) -> int:
        return self._read

    def wake(self) -> None:
        with suppress(BlockingIOError):  # full: a wake-up is pending already
            os.write(self._write, b"\0")

    def clear(self) -> None:
        with suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class Watch:
    """The watch's X connection, DAMAGE object and capturer; use from one thread only."""

    def __init__(self, display_name: str) -> None:
        try:
            self._x = xdisplay.Display(display_name)
        except (DisplayError, ConnectionClosedError, ConnectionError, OSError) as error:
            raise DesktopFailed(f"cannot connect to X display {display_name}: {error}") from None
        try:
            self._x.damage_query_version()
            screen = self._x.screen()
            self._width: int = screen.width_in_pixels
            self._height: int = screen.height_in_pixels
            self._damage = screen.root.damage_create(damage.DamageReportNonEmpty)
            self._damage_type = self._x.extension_event.DamageNotify
            self._capturer = Capturer(display_name, self._x)
        except BaseException as error:
            with suppress(Exception):
                self._x.close()
            if isinstance(error, _X_ERRORS):
                raise DesktopFailed(f"the X display {display_name} failed: {error}") from None
            raise
        self._damaged = False
        self._first = True

    def _on_event(self, event: Event) -> None:
        if event.type == self._damage_type:
            self._damaged = True

    def next_frame(self, timeout_s: float, quality: int, now: bool, wake: Wake,
                   stopped: Callable[[], bool]) -> EncodedImage | None:
        """The screen as JPEG once it changed since the last frame (at once with ``now``
        or on the first call); None if it did not within ``timeout_s`` or ``stopped``
        (checked whenever ``wake`` is written to) says the caller is gone."""
        deadline = time.monotonic() + timeout_s
        try:
            if now or self._first:
                # Damage already on its way is read now, so that it does not count as
                # a change after this frame (it is in the frame).
                self._x.sync()
            drain_events(self._x, self._on_event)
            while not (now or self._first or self._damaged):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stopped():
                    return None
                if self._x.pending_events() == 0:
                    readable, _, _ = select.select(
                        [self._x.fileno(), wake.fileno()], [], [], remaining)
                    if wake.fileno() in readable:
                        wake.clear()
                drain_events(self._x, self._on_event)
            # Emptied before the capture, and the round trip makes sure it was, before
            # the capturer's own connection asks: damage from here on is reported and
            # shows in the next frame. At worst a change during the capture gives one
            # frame more; none is missed.
            self._damaged = False
            self._first = False
            self._x.damage_subtract(self._damage)
            self._x.sync()
            frame = self._capturer.grab(0, 0, self._width, self._height)
        except _X_ERRORS as error:
            raise DesktopFailed(f"the desktop failed: lost the X connection: {error}") from None
        return encode(frame, "jpeg", quality)

    def close(self) -> None:
        with suppress(Exception):
            self._capturer.close()
        with suppress(Exception):
            self._x.close()
