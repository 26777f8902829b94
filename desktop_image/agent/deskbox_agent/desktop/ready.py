"""Waiting for the desktop to be usable: the X server answers, the window manager runs,
and (asked for) Chromium's window is viewable and its toolbar painted.

Every wait is on X events (XFIXES selection notifications, root property and structure
changes, DAMAGE), bounded by the caller's deadline; the only poll is for the X server's
socket to appear, which no event announces.
"""

from __future__ import annotations

import re
import select
import socket
import time
from collections.abc import Callable
from contextlib import suppress

from Xlib import X
from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, DisplayError, XError
from Xlib.ext import damage, xfixes

from .errors import DesktopFailed, Timeout
from .xwait import top_level_clients, wait_for, window_viewable, wm_running

__all__ = ["wait_ready"]

# Chromium's tab strip and toolbar (icons, text, anti-aliasing) use dozens of colours in the
# top rows; a mapped but unpainted window is one flat colour.
_TOOLBAR_ROWS = 90
_TOOLBAR_COLOURS = 16
_SOCKET_RETRY_S = 0.01
_DISPLAY = re.compile(r"^:(\d+)(?:\.\d+)?$")


def _listening(display_name: str) -> bool:
    """Whether the display's unix socket accepts; asked with a socket of our own, because
    python-xlib leaves its socket unclosed when a connection is refused."""
    found = _DISPLAY.match(display_name)
    if found is None:
        return True  # not a local display number: let python-xlib try
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(f"/tmp/.X11-unix/X{found[1]}")
        except OSError:
            return False
    return True


def _connect(display_name: str, deadline: float) -> xdisplay.Display:
    while True:
        if _listening(display_name):
            try:
                return xdisplay.Display(display_name)
            except (OSError, DisplayError, ConnectionClosedError) as error:
                reason = str(error)
        else:
            reason = "its socket does not accept connections yet"
        if time.monotonic() >= deadline:
            raise Timeout(f"the X server {display_name} did not answer: {reason}")
        select.select([], [], [], _SOCKET_RETRY_S)


def wait_ready(
    display_name: str, browser: bool, timeout_s: float,
    while_no_browser_window: Callable[[], None] = lambda: None,
) -> dict[str, float]:
    """Seconds from the call until each stage was reached: xserver, wm[, browser, painted].
    ``while_no_browser_window`` is called each time the browser's window is looked for in
    vain (at least every 50 ms)."""
    started = time.monotonic()
    deadline = started + timeout_s
    timings: dict[str, float] = {}
    x = _connect(display_name, deadline)
    try:
        timings["xserver"] = time.monotonic() - started
        root = x.screen().root
        x.xfixes_query_version()
        x.xfixes_select_selection_input(
            root, x.intern_atom(f"WM_S{x.get_default_screen()}"),
            xfixes.XFixesSetSelectionOwnerNotifyMask,
        )
        # Property changes on the root announce new clients in _NET_CLIENT_LIST.
        root.change_attributes(event_mask=X.PropertyChangeMask | X.SubstructureNotifyMask)
        _wait(x, lambda: wm_running(x), deadline, "the window manager")
        timings["wm"] = time.monotonic() - started
        if browser:

            def browser_window_viewable() -> bool:
                if any(
                    window_viewable(w)
                    and (w.get_wm_class() or ("", ""))[1].lower().startswith("chromium")
                    for w in top_level_clients(x)
                ):
                    return True
                while_no_browser_window()
                return False

            _wait(x, browser_window_viewable, deadline, "the browser window")
            timings["browser"] = time.monotonic() - started
            _wait_toolbar_painted(x, deadline)
            timings["painted"] = time.monotonic() - started
    except (ConnectionClosedError, XError, OSError) as error:
        raise DesktopFailed(f"the desktop failed: lost the X connection: {error}") from None
    finally:
        with suppress(Exception):
            x.close()
    return {name: round(value, 4) for name, value in timings.items()}


def _wait(x: xdisplay.Display, condition: Callable[[], bool], deadline: float,
          what: str) -> None:
    wait_for(x, condition, max(0.0, deadline - time.monotonic()), what)


def _wait_toolbar_painted(x: xdisplay.Display, deadline: float) -> None:
    """A mapped Chromium window is blank at first: wait until its toolbar is drawn.

    Re-checked on DAMAGE events (the screen changed); the check reads a strip of the top
    of the screen, where the maximized browser draws its tab strip and toolbar.
    """
    x.damage_query_version()
    root = x.screen().root
    watch = root.damage_create(damage.DamageReportNonEmpty)
    width = x.screen().width_in_pixels
    height = min(_TOOLBAR_ROWS, x.screen().height_in_pixels)

    def drawn() -> bool:
        x.damage_subtract(watch)
        strip = root.get_image(0, 0, width, height, X.ZPixmap, 0xFFFFFFFF).data
        data = strip.encode("latin-1") if isinstance(strip, str) else bytes(strip)
        # 32-bit pixels; without numpy, so that waiting for a desktop does not load it.
        return len(set(memoryview(data[: len(data) // 4 * 4]).cast("I"))) >= _TOOLBAR_COLOURS

    try:
        _wait(x, drawn, deadline, "the browser to draw its window")
    finally:
        with suppress(Exception):
            x.damage_destroy(watch)
