"""Knowing when other clients have fetched a changed keyboard mapping.

Chromium re-reads the keymap asynchronously after a MappingNotify and translates the keys
it reads meanwhile with the old one. The X server's RECORD extension shows each client's
keymap requests (core GetKeyboardMapping, XKB GetMap), so after changing the mapping we
wait until every client that has re-read it before has re-read it again — instead of
guessing with a sleep. Who re-reads is learned at the first change, or before any, in the
background, once the browser is up (:meth:`KeymapWatch.learn_from`): the first change then
waits only for them.
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
        self._started: dict[int, float] = {}  # client id base → when it connected
        # A change nobody waits for (learn_from): when, and the end of the window in which
        # re-reads count (keys sent end it early); the clients that re-read it in that
        # window, each at its first. None once the next change has taken them (or not).
        self._learning: tuple[float, float] | None = None
        self._rereads: dict[int, float] = {}
        self._learned_before = False  # learn_from was called (it is tried once)
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
                    "client_started": True,
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
                self._rereads.pop(base, None)
                self._fetched.pop(base, None)
                self._started.pop(base, None)
            elif category == record.ClientStarted:
                self._started[base] = time.monotonic()
            elif category == record.FromClient and base != self._own_base:
                now = self._fetched[base] = time.monotonic()
                learning = self._learning
                if (learning is not None and learning[0] <= now <= learning[1]
                        and self._started.get(base, 0.0) < learning[0]):
                    self._rereads.setdefault(base, now)
            self._lock.notify_all()

    @property
    def knows_readers(self) -> bool:
        """Whether the clients that re-read a changed keymap are known, or were looked for."""
        with self._lock:
            return bool(self._readers) or self._learned_before

    def learn_from(self, since: float, window_s: float) -> None:
        """The keymap was changed at ``since`` and nobody waits: the clients connected before
        it that re-read it within ``window_s`` become its readers, if their re-reads had
        stopped (for the quiet a change that learns on the spot waits for) before the next
        change or keys sent (:meth:`keys_sent`). So it is for when nobody types: a client
        that reads the keymap only when a key comes (two of Chromium's four connections do)
        would be taken for a reader, and every change would wait for it until its timeout
        (the agent's keys end the window; a person's over the live view would not)."""
        with self._lock:
            self._learning = (since, since + window_s)
            self._rereads.clear()
            self._learned_before = True

    def keys_sent(self, at: float) -> None:
        """Keys go out from ``at``: reads after it may be for them, not re-reads."""
        with self._lock:
            if self._learning is not None and at < self._learning[1]:
                self._learning = (self._learning[0], at)

    def _adopt_learned_readers(self, change: float, quiet_s: float) -> None:
        """At the first change after :meth:`learn_from` (under the lock): its readers become
        known if their re-reads had stopped for ``quiet_s`` before the window ended, and no
        client that connected since has read the keymap (a browser started later: whether
        it re-reads is not known). Else this change learns on the spot, as without it."""
        if self._learning is None:
            return
        start, end = self._learning
        end = min(end, change)
        heard = {c: at for c, at in self._rereads.items() if at < end}
        self._learning = None
        self._rereads.clear()
        settled = bool(heard) and end - max(heard.values()) >= quiet_s
        newcomers = any(self._started.get(c, 0.0) >= start for c in self._fetched)
        if settled and not newcomers:
            self._readers |= heard.keys()

    def wait_reread(self, since: float, timeout_s: float, quiet_s: float = 0.1) -> bool:
        """Wait until the clients that re-read the keymap before have done so after ``since``.

        With no such client known yet (the first change in this desktop's life, unless
        :meth:`learn_from` learned them), wait until some client has re-read and then
        ``quiet_s`` passed without another, and remember who did. False if that did not
        happen within ``timeout_s``.
        """
        deadline = since + timeout_s
        with self._lock:
            if self._failure is not None:
                raise DesktopFailed(f"the desktop failed: {self._failure}")
            self._adopt_learned_readers(since, quiet_s)
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
