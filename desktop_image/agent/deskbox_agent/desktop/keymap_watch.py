"""Knowing when other clients have fetched a changed keyboard mapping.

Chromium re-reads the keymap asynchronously after a MappingNotify and translates the keys
it reads meanwhile with the old one. The X server's RECORD extension shows each client's
keymap requests (core GetKeyboardMapping, XKB GetMap), so after changing the mapping we
wait until every client that has re-read it before has re-read it again — instead of
guessing with a sleep.
"""

from __future__ import annotations

import threading
import time
from contextlib import suppress

from Xlib import display as xdisplay
from Xlib.ext import record

from .errors import DesktopFailed

__all__ = ["KeymapWatch"]

_GET_KEYBOARD_MAPPING = 101
_XKB_GET_MAP = 8


class KeymapWatch:
    """A RECORD context on its own connection and thread; ``close`` ends both."""

    def __init__(self, display_name: str, control: xdisplay.Display) -> None:
        self._control = control
        self._own_base: int = control.display.info.resource_id_base
        self._mask: int = control.display.info.resource_id_mask
        self._lock = threading.Condition()
        self._fetched: dict[int, float] = {}  # client id base → last keymap fetch
        self._readers: set[int] = set()  # clients seen re-reading after one of our changes
        self._failure: str | None = None  # why the X server's connection was closed on us
        self._closing = False
        xkb = control.query_extension("XKEYBOARD")
        xkb_requests = (
            (xkb.major_opcode, xkb.major_opcode, _XKB_GET_MAP, _XKB_GET_MAP)
            if xkb is not None and xkb.present
            else (0, 0, 0, 0)
        )
        self._recorder = xdisplay.Display(display_name)
        self._context = self._recorder.record_create_context(
            0,
            [record.AllClients],
            [
                {
                    "core_requests": (_GET_KEYBOARD_MAPPING, _GET_KEYBOARD_MAPPING),
                    "core_replies": (0, 0),
                    "ext_requests": xkb_requests,
                    "ext_replies": (0, 0, 0, 0),
                    "delivered_events": (0, 0),
                    "device_events": (0, 0),
                    "errors": (0, 0),
                    "client_started": False,
                    "client_died": True,
                }
            ],
        )
        self._thread = threading.Thread(target=self._run, name="keymap-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._recorder.record_enable_context(self._context, self._on_data)
        except Exception as error:  # noqa: BLE001 (closed under us at close(), or X went away)
            with self._lock:
                if not self._closing:
                    self._failure = f"the keymap watch lost the X server: {error}"
                self._lock.notify_all()

    def _on_data(self, reply: object) -> None:
        category = getattr(reply, "category", None)
        base = int(getattr(reply, "id_base", 0))
        with self._lock:
            if category == record.ClientDied:
                self._readers.discard(base)
                self._fetched.pop(base, None)
            elif category == record.FromClient and base != self._own_base:
                self._fetched[base] = time.monotonic()
            self._lock.notify_all()

    def wait_reread(self, since: float, timeout_s: float, quiet_s: float = 0.1) -> bool:
        """Wait until the clients that re-read the keymap before have done so after ``since``.

        With no such client known yet (the first change in this desktop's life), wait until
        some client has re-read and then ``quiet_s`` passed without another, and remember
        who did. False if that did not happen within ``timeout_s``.
        """
        deadline = since + timeout_s
        with self._lock:
            if self._failure is not None:
                raise DesktopFailed(f"the desktop failed: {self._failure}")
            if self._readers:
                done = self._lock.wait_for(
                    lambda: all(self._fetched.get(c, 0.0) >= since for c in self._readers),
                    timeout=max(0.0, deadline - time.monotonic()),
                )
            else:
                done = False
                while (now := time.monotonic()) < deadline:
                    latest = max((at for at in self._fetched.values() if at >= since),
                                 default=None)
                    if latest is not None and now - latest >= quiet_s:
                        done = True
                        break
                    self._lock.wait(timeout=min(quiet_s / 4, deadline - now))
            self._learn(since)
            return bool(done)

    def _learn(self, since: float) -> None:
        self._readers |= {c for c, at in self._fetched.items() if at >= since}

    def close(self) -> None:
        self._closing = True
        with suppress(Exception):
            self._control.record_disable_context(self._context)
            self._control.flush()
        self._thread.join(timeout=2)
        with suppress(Exception):
            self._control.record_free_context(self._context)
            self._control.flush()
        with suppress(Exception):
            self._recorder.close()
