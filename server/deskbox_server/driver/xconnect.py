"""python-xlib connections to a sandbox's X server, with every read bounded.

python-xlib takes a reply's or GenericEvent's length from its header and then reads until it
has that much, growing its buffer by concatenation: one 300 MiB event announced by a hostile
X server costs the whole control plane minutes of CPU and hundreds of MB. Here each
connection checks the length as soon as a header is in the buffer (``parse_response`` sets
it, before the next read), and the events queued and received per second (``xlimits``).
A breach closes the connection and raises ``DesktopFailed``; later calls on it raise at once.

Every host-side python-xlib connection to a session's display is made by ``open_display``.
"""

from __future__ import annotations

from typing import NoReturn

from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError
from Xlib.protocol import display as protocol
from Xlib.protocol.rq import Event

from ..errors import DesktopFailed
from .xlimits import MAX_QUEUED_EVENTS, EventBudget, flood, oversize, reply_limit

__all__ = ["XServerMisbehaved", "open_display"]

_GENERIC_EVENT = 35


class XServerMisbehaved(ConnectionClosedError):
    """What every call on a connection closed for a breach raises."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def open_display(display_name: str) -> xdisplay.Display:
    """A python-xlib ``Display`` whose reads from the X server are bounded."""
    return _BoundedDisplay(display_name)


class _BoundedDisplay(xdisplay.Display):
    def _update_keymap(self, first_keycode: int, count: int) -> None:
        # python-xlib's __init__ calls this right after the connection setup (itself at most
        # 256 KiB), for its first reply: the bound goes on before that reply is read.
        if not isinstance(self.display.parse_response, _ReadBound):
            try:
                _ReadBound(self.display)
            except DesktopFailed as error:  # a screen larger than we ever make
                self.display.close_internal(error.message)
                raise
        super()._update_keymap(first_keycode, count)  # type: ignore[misc]


class _ReadBound:
    """Wraps one connection's ``parse_response`` (an instance attribute shadowing the method)."""

    def __init__(self, conn: protocol.Display) -> None:
        self._conn = conn
        roots = conn.info.roots
        self._limit = max(reply_limit(r.width_in_pixels, r.height_in_pixels) for r in roots)
        self._parse = conn.parse_response
        self._budget = EventBudget()
        conn.parse_response = self  # type: ignore[method-assign]

    def __call__(self, request: int) -> bool:
        conn = self._conn
        queued = len(conn.event_queue)
        try:
            got = self._parse(request)
        except Exception as error:  # noqa: BLE001 (a message python-xlib cannot parse)
            self._fail(f"the X server sent a malformed message ({type(error).__name__})")
        if conn.recv_packet_len > self._limit:
            kind = "reply" if conn.data_recv[0] == 1 else "event"
            self._fail(oversize(kind, conn.recv_packet_len, self._limit))
        events = conn.event_queue
        if len(events) > queued:
            if len(events) > MAX_QUEUED_EVENTS:
                self._fail(f"the X server queued more than {MAX_QUEUED_EVENTS} events")
            if not self._budget.spend(len(events) - queued):
                self._fail(flood())
            if _queued_bytes(events) > self._limit:
                self._fail(oversize("queue of events", _queued_bytes(events), self._limit))
        return got

    def _fail(self, reason: str) -> NoReturn:
        conn = self._conn
        conn.close_internal(reason)
        conn.socket_error = XServerMisbehaved(reason)
        # We leave python-xlib's send_and_recv by raising, so do what it does on its way out:
        # wake threads waiting on this connection, which then find it closed.
        conn.send_recv_lock.acquire()
        try:
            conn.recv_active = conn.send_active = 0
            for waiting, lock in (("event_waiting", "event_wait_lock"),
                                  ("request_waiting", "request_wait_lock")):
                if getattr(conn, waiting):
                    setattr(conn, waiting, 0)
                    getattr(conn, lock).release()
        finally:
            conn.send_recv_lock.release()
        raise DesktopFailed(reason)


def _queued_bytes(events: list[Event]) -> int:
    return sum(len(getattr(event, "_binary", b"")) for event in events)
