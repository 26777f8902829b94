"""Settle detection: the screen has stopped changing, as the X server's DAMAGE reports it."""

from __future__ import annotations

import time
from collections.abc import Callable

from Xlib.display import Display
from Xlib.ext import damage
from Xlib.protocol.rq import Event

from .cpu_waits import CpuWaits, Sample
from .xwait import drain_events, wait_readable

__all__ = ["SettleWatcher"]


class SettleWatcher:
    """Tracks damage on the root window with one DAMAGE object (ReportNonEmpty).

    The server sends one event when the screen first changes and no more until we subtract,
    so an idle watcher costs nothing; we only re-arm it while waiting for quiet. Because the
    region is emptied only when damage was seen, "no event since the last subtract" means
    "no change since then": ``quiet_since`` gives that time, so a batch that only looks
    need not wait out a fresh quiet window on a screen that has long been still.
    """

    def __init__(self, display: Display, on_other_event: Callable[[Event], None],
                 waits: CpuWaits | None = None) -> None:
        """``waits``: the desktop's programs' waits for a CPU, which quiet does not count."""
        self._display = display
        self._waits = waits
        display.damage_query_version()
        self._damage = display.screen().root.damage_create(damage.DamageReportNonEmpty)
        self._damage_type = display.extension_event.DamageNotify
        self._on_other_event = on_other_event
        self._damaged = False
        self._clean_since = time.monotonic()  # the damage region is empty since then
        self._changes = 0  # damage events seen: a count that moves when the screen does
        # A round trip of this batch found the region empty, and nothing came or was
        # emptied since: any change after that round trip will be reported.
        self._confirmed = False

    def _handle(self, event: Event) -> None:
        if event.type == self._damage_type:
            self._damaged = True
            self._changes += 1
            self._confirmed = False
        else:
            self._on_other_event(event)

    def _take_damage(self) -> bool:
        """Whether the screen changed since the last look; empties the region if so."""
        drain_events(self._display, self._handle)
        if not self._damaged:
            return False
        self._damaged = False
        self._confirmed = False  # until a round trip shows the subtract done
        self._display.damage_subtract(self._damage)
        self._display.flush()
        self._clean_since = time.monotonic()
        return True

    def _sync(self) -> None:
        """A round trip, then the events it brought: damage before now is seen."""
        self._display.sync()
        drain_events(self._display, self._handle)
        if not self._damaged:
            self._confirmed = True  # every damage seen was subtracted before the round trip

    def arm(self) -> None:
        """Forget damage seen so far: what follows is caused by the next actions."""
        self._take_damage()

    def find_programs(self) -> None:
        """Before actions whose settling will be awaited: look for the desktop's programs
        if the last look is old (an X round trip and ``/proc``; cpu_waits.py), so that the
        wait does not pay for it. Never from the event loop's quick pointer path, which
        must not wait on the X server."""
        if self._waits is not None:
            self._waits.refresh()

    def forgive(self) -> float:
        """The damage so far left every pixel as it was (a repaint): empty the region and
        count quiet from before it; since when that is."""
        clean_since = self._clean_since
        self._take_damage()
        self._clean_since = clean_since
        return clean_since

    def quiet_since(self) -> float | None:
        """Since when the screen has not changed, or None if it changed since we last
        looked. A round trip first: damage the server reported before now is then read."""
        self._sync()
        return None if self._damaged else self._clean_since

    def changes(self) -> int | None:
        """A count of the screen's changes that moves with every change after this call;
        None if the screen kept changing while we asked.

        Round trips until one finds no new damage (none if one of this batch did so and
        nothing came since): damage before it has then been seen, and the region, emptied
        before it, reports the next change."""
        for _ in range(3):
            if self._confirmed:
                return self._changes
            self._take_damage()
            self._sync()
        return self._changes if self._confirmed else None

    def new_batch(self) -> None:
        """Round trips of earlier batches no longer vouch for what the screen shows now."""
        self._confirmed = False

    def wait_quiet(self, quiet_s: float, timeout_s: float, since: float | None = None,
                   unchanged: Callable[[], bool] | None = None) -> bool:
        """Wait for ``quiet_s`` without damage, counted from ``since`` if given (a time
        ``quiet_since`` vouched for), else from now; False if it kept changing past
        ``timeout_s``. ``unchanged``: asked after damage, whether the screen is as it was
        (a repaint of the same pixels counts as no change).

        Until the screen first changes, quiet while the desktop's programs waited for a
        CPU does not count (cpu_waits.py): the time they were held since this call
        lengthens the window by as much, so that a screen still only because its
        programs have not run yet is not called settled. Once it changed, quiet counts as
        on an idle host: after answering a click Chromium goes on working unseen for a
        while (its renderer runnable for 0.6 s with two busy loops), and counting that
        doubled the settle for no screenshot less wrong. Quiet that is already long
        enough when the call comes is taken as it is."""
        start = time.monotonic()
        deadline = start + timeout_s
        last_change = start if since is None else min(since, start)
        if since is not None:
            self._sync()  # damage up to now is read before quiet is declared
        waits = self._waits
        # The programs' waits as the call began; None once the screen has answered.
        before: Sample | None = None
        if waits is not None and start - last_change < quiet_s:
            before = waits.sample()
        held = 0.0
        while True:
            clean_since = self._clean_since
            if self._take_damage():
                if unchanged is not None and unchanged():
                    self._clean_since = clean_since
                else:
                    last_change = time.monotonic()
                    before, held = None, 0.0  # it answered: quiet is quiet from here
            now = time.monotonic()
            if now - last_change - held >= quiet_s:
                if waits is None or before is None:
                    return True
                held = waits.held_s(before, waits.sample())
                now = time.monotonic()
                if now - last_change - held >= quiet_s:
                    return True
            if now >= deadline:
                return False
            wait_readable(self._display, min(last_change + held + quiet_s, deadline) - now)

    def pump(self) -> None:
        """Handle events that arrived between actions (layout changes, stray damage).
        Damage seen empties the region: quiet is counted from here on, so a batch without
        actions (the warm pool sends one when a desktop is ready) clears damage older than
        itself."""
        self._take_damage()
