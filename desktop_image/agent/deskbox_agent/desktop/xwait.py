"""Waiting on an X connection by observation: events and replies, bounded by a deadline."""

from __future__ import annotations

import select
import time
from collections.abc import Callable

from Xlib import X, Xatom
from Xlib.display import Display
from Xlib.error import XError
from Xlib.protocol.rq import Event
from Xlib.xobject.drawable import Window

from .errors import Timeout

__all__ = ["drain_events", "top_level_clients", "wait_for", "wait_readable", "wm_running"]


def wait_readable(display: Display, timeout_s: float) -> bool:
    """Block until the server has sent something or ``timeout_s`` passes."""
    if display.pending_events():
        return True
    readable, _, _ = select.select([display.fileno()], [], [], max(0.0, timeout_s))
    return bool(readable)


def drain_events(display: Display, on_event: Callable[[Event], None] | None = None) -> int:
    """Read every event already received; returns how many there were."""
    count = 0
    while display.pending_events():
        event = display.next_event()
        count += 1
        if on_event is not None:
            on_event(event)
    return count


def wait_for(
    display: Display, condition: Callable[[], bool], timeout_s: float, what: str
) -> None:
    """Re-check ``condition`` whenever an event arrives (or every 50 ms) until it holds.

    The caller selects the events that can change the condition on ``display`` first, so a
    change is seen as soon as the server reports it; the 50 ms re-check only covers state the
    server announces to nobody (a selection owned before we asked).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout(f"timed out after {timeout_s:.1f} s waiting for {what}")
        if wait_readable(display, min(remaining, 0.05)):
            drain_events(display)


def wm_running(display: Display) -> bool:
    """A window manager owns the ICCCM ``WM_S<screen>`` selection once it manages the screen."""
    atom = display.intern_atom(f"WM_S{display.get_default_screen()}")
    return bool(display.get_selection_owner(atom))


def top_level_clients(display: Display) -> list[Window]:
    """Client windows the window manager lists in ``_NET_CLIENT_LIST`` (EWMH)."""
    root = display.screen().root
    prop = root.get_full_property(display.intern_atom("_NET_CLIENT_LIST"), Xatom.WINDOW)
    if prop is None:
        return []
    return [display.create_resource_object("window", wid) for wid in prop.value]


def window_viewable(window: Window) -> bool:
    try:
        return bool(window.get_attributes().map_state == X.IsViewable)
    except XError:
        return False
