"""HTTP/2 flow control of what one end receives: the same on both ends of the stream.

Both ends use it: the agent for what the host sends (h2server.py), the host for what the
agent sends (server/deskbox_server/agent/connection.py, which imports it from this package).

Received DATA is acknowledged (its window handed back to the sender) only as it is read.
A stream's window comes back once its reader took the data, so one stream holds at most
its window (one WINDOW_UPDATE for all that was read, once the sender has half of the
window or less left). The connection's comes back as data arrives, as long as all streams
together hold less than ``budget`` unread: a channel nobody reads stalls itself, not the
calls beside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

import h2.connection
import h2.exceptions

__all__ = ["InboundWindows", "WindowedStream"]


class WindowedStream(Protocol):
    id: int
    owed: int  # bytes read (or padding) whose stream window is not handed back yet


class InboundWindows:
    def __init__(
        self, conn: h2.connection.H2Connection, stream_window: int, connection_window: int,
        budget: int, live: Callable[[], bool],
    ) -> None:
        """``live``: whether the connection still stands (nothing is handed back after)."""
        self._h2 = conn
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._budget = budget
        self._live = live
        self._owed = 0  # connection window not handed back yet
        self._unread = 0  # bytes received for live streams that no reader took yet

    def received(self, stream: WindowedStream, flow_len: int, data_len: int) -> None:
        """DATA for ``stream``: ``data_len`` bytes to read of ``flow_len`` flow-controlled
        ones (the rest is padding, which nobody will read)."""
        self._owed += flow_len
        self._unread += data_len
        stream.owed += flow_len - data_len

    def dropped(self, flow_len: int) -> None:
        """DATA for a stream given up: only the connection's window takes it back."""
        self._owed += flow_len

    def read(self, stream: WindowedStream, size: int) -> None:
        """A reader took ``size`` bytes of ``stream``."""
        self._unread -= size
        stream.owed += size
        if self._live() and stream.owed:
            with contextlib.suppress(h2.exceptions.H2Error, KeyError):
                window = self._h2.streams[stream.id].inbound_flow_control_window
                if window <= self._stream_window // 2:
                    self._h2.increment_flow_control_window(stream.owed, stream.id)
                    stream.owed = 0
        self.release()

    def discarded(self, size: int) -> None:
        """``size`` unread bytes of a stream that is over: no reader will take them."""
        self._unread -= size
        self.release()

    def release(self) -> None:
        """Hand the connection's window back if the unread bytes allow it."""
        if (self._live() and self._unread <= self._budget
                and self._owed >= self._connection_window // 4):
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.increment_flow_control_window(self._owed)
            self._owed = 0
