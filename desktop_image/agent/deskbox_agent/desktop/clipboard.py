"""The session's clipboard: the X ``CLIPBOARD`` selection, read and owned with python-xlib.

Reading converts the selection to UTF-8 text into a property of our own window (on the
caller's thread, the desktop's worker). Owning it means answering other clients'
``SelectionRequest`` events for as long as we own it, whenever they ask (a paste in the
browser, x11vnc passing it to viewers), so the owner has its own X connection served by a
small thread, started on the first ``set``; it also writes the root window's CUT_BUFFER0, which
x11vnc passes to viewers (as Latin-1), and writes it again each second for 8 s: x11vnc
passes no change of it on for a while after viewers came (about 1 s with one viewer, 5 s
with three; it would pass the text on only ~15 s later, from its own polling). Both
directions are bounded by ``MAX_CLIPBOARD_BYTES`` (no INCR transfers).
"""

from __future__ import annotations

import os
import select
import threading
import time
from contextlib import suppress

from Xlib import X, Xatom
from Xlib import display as xdisplay
from Xlib.protocol import event as xevent
from Xlib.protocol.rq import Event
from Xlib.xobject.drawable import Window

from .errors import DesktopFailed, InvalidAction, Timeout

__all__ = ["MAX_CLIPBOARD_BYTES", "Clipboard"]

# Well below the X server's maximum request size without BIG-REQUESTS (256 KiB).
MAX_CLIPBOARD_BYTES = 200_000
_READ_TIMEOUT_S = 2.0
_TEXT_TARGETS = ("UTF8_STRING", "text/plain;charset=utf-8", "STRING", "TEXT")
# When CUT_BUFFER0 is written again after a set (seconds after it): one rewrite was enough
# for one viewer, but two that had just come got the first change 16 s late.
_REPUBLISH_AT_S = tuple(float(after) for after in range(1, 9))


def _wait_event(
    x: xdisplay.Display, match: type[Event], window: int, deadline: float
) -> Event | None:
    while True:
        while x.pending_events():
            event = x.next_event()
            if isinstance(event, match) and event.requestor.id == window:
                return event
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        select.select([x.fileno()], [], [], remaining)


class _Owner(threading.Thread):
    """Owns CLIPBOARD with the text it was given, until another client takes it."""

    def __init__(self, display_name: str) -> None:
        super().__init__(name=f"clipboard-{display_name}", daemon=True)
        self._x = xdisplay.Display(display_name)
        self._window = self._x.screen().root.create_window(0, 0, 1, 1, 0, X.CopyFromParent)
        self._atoms = {name: self._x.intern_atom(name) for name in
                       ("CLIPBOARD", "TARGETS", "TIMESTAMP", *_TEXT_TARGETS)}
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._lock = threading.Lock()
        self._pending: tuple[bytes, threading.Event, list[bool]] | None = None
        self._text = b""
        self._owned = False
        self._closing = False
        # (when, which of _REPUBLISH_AT_S, CUT_BUFFER0 text)
        self._republish: tuple[float, int, bytes] | None = None
        self._set_at = 0.0
        self.failure: str | None = None  # why the X server's connection was closed on us
        self._stopped = False

    def owned_text(self) -> bytes | None:
        with self._lock:
            return self._text if self._owned else None

    def claim(self, text: bytes, timeout_s: float = _READ_TIMEOUT_S) -> None:
        done = threading.Event()
        result: list[bool] = []
        with self._lock:
            if self._stopped:  # the thread is gone, or going (it answers no more claims)
                raise DesktopFailed(f"the desktop failed: {self.failure or 'no clipboard owner'}")
            self._pending = (text, done, result)
        os.write(self._wake_w, b"c")
        if not done.wait(timeout_s):
            raise Timeout("the clipboard owner did not answer")
        if self.failure is not None:
            raise DesktopFailed(f"the desktop failed: {self.failure}")
        if not result or not result[0]:
            raise DesktopFailed("could not take the clipboard selection")

    def close(self) -> None:
        self._closing = True
        with suppress(OSError):
            os.write(self._wake_w, b"q")
        self.join(timeout=2)
        for fd in (self._wake_r, self._wake_w):
            with suppress(OSError):
                os.close(fd)

    def run(self) -> None:
        x = self._x
        try:
            while not self._closing:
                timeout = 1.0
                if self._republish is not None:
                    timeout = min(timeout, max(0.0, self._republish[0] - time.monotonic()))
                readable, _, _ = select.select([x.fileno(), self._wake_r], [], [], timeout)
                if self._wake_r in readable:
                    with suppress(BlockingIOError):
                        os.read(self._wake_r, 64)
                    self._take_pending()
                while x.pending_events():
                    self._handle(x.next_event())
                if self._republish is not None and time.monotonic() >= self._republish[0]:
                    self._republish_cut_buffer()
        except Exception:  # noqa: BLE001 (the display went away: nothing left to own)
            with self._lock:
                self._owned = False
        finally:
            with self._lock:
                self._stopped = True
                pending, self._pending = self._pending, None
            if pending is not None:
                pending[1].set()  # unanswered: claim() says why
            with suppress(Exception):
                x.close()

    def _take_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        text, done, result = pending
        try:
            self._own(text, result)
        except DesktopFailed as error:
            with self._lock:
                self.failure = error.message  # before claim() wakes up and asks
            raise
        finally:
            done.set()  # with no result if it failed: claim() then says why

    def _own(self, text: bytes, result: list[bool]) -> None:
        clipboard = self._atoms["CLIPBOARD"]
        # PRIMARY too: what middle-click pastes, and what x11vnc follows most closely.
        self._window.set_selection_owner(Xatom.PRIMARY, X.CurrentTime)
        self._window.set_selection_owner(clipboard, X.CurrentTime)
        owned = self._x.get_selection_owner(clipboard) == self._window
        # And the root's CUT_BUFFER0, which x11vnc passes on to viewers at once (it does
        # not notice a new selection owner reliably). Cut buffers hold Latin-1.
        latin = text.decode("utf-8").encode("latin-1", errors="replace")
        self._x.screen().root.change_property(Xatom.CUT_BUFFER0, Xatom.STRING, 8, latin)
        self._x.flush()
        self._set_at = time.monotonic()
        self._republish = (self._set_at + _REPUBLISH_AT_S[0], 0, latin)
        with self._lock:
            self._text, self._owned = text, owned
        result.append(owned)

    def _republish_cut_buffer(self) -> None:
        """CUT_BUFFER0 written again, unless someone changed it or took the clipboard; then
        again at the next of _REPUBLISH_AT_S."""
        assert self._republish is not None
        _, which, latin = self._republish
        self._republish = None
        if self.owned_text() is None:
            return
        root = self._x.screen().root
        reply = root.get_property(Xatom.CUT_BUFFER0, Xatom.STRING, 0, len(latin) // 4 + 1)
        value = reply.value if reply is not None else b""
        if (value.encode("latin-1") if isinstance(value, str) else bytes(value)) != latin:
            return
        root.change_property(Xatom.CUT_BUFFER0, Xatom.STRING, 8, latin)
        self._x.flush()
        if which + 1 < len(_REPUBLISH_AT_S):
            self._republish = (self._set_at + _REPUBLISH_AT_S[which + 1], which + 1, latin)

    def _handle(self, event: Event) -> None:
        if event.type == X.SelectionClear:
            if event.atom == self._atoms["CLIPBOARD"]:
                with self._lock:
                    self._owned = False
        elif event.type == X.SelectionRequest:
            self._answer(event)

    def _answer(self, request: Event) -> None:
        atoms = self._atoms
        target = request.target
        prop = request.property if request.property != X.NONE else target
        text = self.owned_text()
        requestor = request.requestor
        if text is None or request.selection not in (atoms["CLIPBOARD"], Xatom.PRIMARY):
            prop = X.NONE
        elif target == atoms["TARGETS"]:
            targets = [atoms["TARGETS"], atoms["TIMESTAMP"], *(atoms[n] for n in _TEXT_TARGETS)]
            requestor.change_property(prop, Xatom.ATOM, 32, targets)
        elif target == atoms["TIMESTAMP"]:
            requestor.change_property(prop, Xatom.INTEGER, 32, [X.CurrentTime])
        elif target in (atoms["UTF8_STRING"], atoms["text/plain;charset=utf-8"], atoms["TEXT"]):
            requestor.change_property(prop, atoms["UTF8_STRING"], 8, text)
        elif target == atoms["STRING"]:
            latin = text.decode("utf-8").encode("latin-1", errors="replace")
            requestor.change_property(prop, Xatom.STRING, 8, latin)
        else:
            prop = X.NONE
        notify = xevent.SelectionNotify(
            time=request.time, requestor=requestor, selection=request.selection,
            target=target, property=prop,
        )
        requestor.send_event(notify)
        self._x.flush()


class Clipboard:
    """CLIPBOARD of one display; use it on one thread (the desktop's worker)."""

    def __init__(self, display_name: str) -> None:
        self._display_name = display_name
        self._x: xdisplay.Display | None = None
        self._window: Window | None = None
        self._owner: _Owner | None = None

    def set(self, text: str) -> None:
        data = text.encode("utf-8")
        if len(data) > MAX_CLIPBOARD_BYTES:
            raise InvalidAction(f"clipboard text is over {MAX_CLIPBOARD_BYTES} bytes in UTF-8")
        self._check_owner()
        if self._owner is None or not self._owner.is_alive():
            self._owner = _Owner(self._display_name)
            self._owner.start()
        self._owner.claim(data)

    def get(self, timeout_s: float = _READ_TIMEOUT_S) -> str:
        """The text on the clipboard ("" when nobody owns it or it holds no text)."""
        self._check_owner()
        if self._owner is not None:
            mine = self._owner.owned_text()
            if mine is not None:
                return mine.decode("utf-8", errors="replace")
        x, window = self._reader()
        clipboard = x.intern_atom("CLIPBOARD")
        if x.get_selection_owner(clipboard) == X.NONE:
            return ""
        prop = x.intern_atom("DESKBOX_CLIPBOARD")
        deadline = time.monotonic() + timeout_s
        for target in ("UTF8_STRING", "STRING"):
            window.convert_selection(clipboard, x.intern_atom(target), prop, X.CurrentTime)
            x.flush()
            notify = _wait_event(x, xevent.SelectionNotify, window.id, deadline)
            if notify is None:
                raise Timeout("the clipboard's owner did not answer in time")
            if notify.property != X.NONE:
                return self._read_property(x, window, prop)
        return ""

    def _check_owner(self) -> None:
        if self._owner is not None and self._owner.failure is not None:
            raise DesktopFailed(f"the desktop failed: {self._owner.failure}")

    def _read_property(self, x: xdisplay.Display, window: Window, prop: int) -> str:
        reply = window.get_property(prop, X.AnyPropertyType, 0, MAX_CLIPBOARD_BYTES // 4 + 1)
        window.delete_property(prop)
        x.flush()
        if reply is None:
            return ""
        if reply.property_type == x.intern_atom("INCR") or reply.bytes_after:
            raise InvalidAction(f"the clipboard holds more than {MAX_CLIPBOARD_BYTES} bytes")
        value = reply.value
        data = value.encode("latin-1") if isinstance(value, str) else bytes(value)
        if len(data) > MAX_CLIPBOARD_BYTES:
            raise InvalidAction(f"the clipboard holds more than {MAX_CLIPBOARD_BYTES} bytes")
        encoding = "latin-1" if reply.property_type == Xatom.STRING else "utf-8"
        return data.decode(encoding, errors="replace")

    def _reader(self) -> tuple[xdisplay.Display, Window]:
        if self._x is None or self._window is None:
            self._x = xdisplay.Display(self._display_name)
            self._window = self._x.screen().root.create_window(
                0, 0, 1, 1, 0, X.CopyFromParent
            )
        return self._x, self._window

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
            self._owner = None
        if self._x is not None:
            with suppress(Exception):
                self._x.close()
            self._x = None
            self._window = None
