"""Settle detection: the screen has stopped changing, as the X server's DAMAGE reports it."""

from __future__ import annotations

import time
from collections.abc import Callable

from Xlib.display import Display
from Xlib.ext import damage
from Xlib.protocol.rq import Event

from .xwait import drain_events, wait_readable

__all__ = ["SettleWatcher"]


class SettleWatcher:
    """Tracks damage on the root window with one DAMAGE object (ReportNonEmpty).

    The server sends one event when the screen first changes and no more until we subtract,
    so an idle watcher costs nothing; we only re-arm it while waiting for quiet.
    """

    def __init__(self, display: Display, on_other_event: Callable[[Event], None]) -> None:
        self._display = display
        display.damage_query_version()
        self._damage = display.screen().root.damage_create(damage.DamageReportNonEmpty)
        self._damage_type = display.extension_event.DamageNotify
        self._on_other_event = on_other_event
        self._damaged = False

    def _handle(self, event: Event) -> None:
        if event.type == self._damage_type:
            self._damaged = True
        else:
            self._on_other_event(event)

    def arm(self) -> None:
        """Forget damage seen so far: what follows is caused by the next actions."""
        drain_events(self._display, self._handle)
        self._display.damage_subtract(self._damage)
        self._damaged = False

    def wait_quiet(self, quiet_s: float, timeout_s: float) -> bool:
        """Wait for ``quiet_s`` without damage; False if it kept changing past ``timeout_s``."""
        start = time.monotonic()
        deadline = start + timeout_s
        last_change = start
        while True:
            now = time.monotonic()
            if now - last_change >= quiet_s:
                return True
            if now >= deadline:
                return False
            wait = min(last_change + quiet_s, deadline) - now
            if wait_readable(self._display, wait):
                drain_events(self._display, self._handle)
                if self._damaged:
                    last_change = time.monotonic()
                    self._damaged = False
                    self._display.damage_subtract(self._damage)
                    self._display.flush()

    def pump(self) -> None:
        """Handle events that arrived between actions (layout changes, stray damage)."""
        drain_events(self._display, self._handle)
