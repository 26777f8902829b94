"""One HTTP/2 connection to a sandbox's agent, over any asyncio byte stream.

The host is the HTTP/2 client. The agent is hostile, so:

- every frame header passes :class:`~.frames.FrameGuard` before h2 keeps its payload;
- received DATA is acknowledged (its window handed back) only when a caller has read it,
  so what an agent can make us hold is the connection window (``AgentLimits``);
- frames without payload for a live stream draw on a budget, so floods of SETTINGS, PING
  or empty frames end the connection rather than our CPU;
- any protocol error, a closed stream or an agent that stops reading what we send fails
  the whole connection with :class:`AgentFailed` and its reason; every waiting call gets
  that error. Timeouts of single calls only cancel their stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

import h2.errors
import h2.events
import h2.exceptions

from deskbox_agent.frames import FrameGuard, FrameViolation
from deskbox_agent.h2setup import new_connection
from deskbox_agent.windows import InboundWindows

from ..errors import AgentFailed
from .limits import AgentLimits

__all__ = ["AgentConnection", "AgentStream", "StreamReset", "take_bytes"]

log = logging.getLogger("deskbox.agent")

FLOOD = "a flood of frames without payload (SETTINGS, PING, empty or unknown frames)"


class StreamReset(Exception):
    """The agent reset one stream (a refused or abandoned call); the connection lives."""

    def __init__(self, stream_id: int, code: int) -> None:
        super().__init__(f"the agent reset stream {stream_id} (code {code})")
        self.code = code


class AgentStream:
    """One request and its response; the body is read as it comes, within the window."""

    def __init__(self, conn: AgentConnection, stream_id: int) -> None:
        self._conn = conn
        self.id = stream_id
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._head = asyncio.Event()
        self._arrived = asyncio.Event()
        self._body = bytearray()
        self.ended = False
        self.reset: StreamReset | None = None
        self.closed = False  # we reset it or it is complete both ways
        self.sent_end = False  # our request is complete (END_STREAM sent)
        self.owed = 0  # bytes read here whose stream window is not handed back yet
        self._body_wanted = False  # reading: a reset after a complete response is no error

    # -- events from the connection -------------------------------------------------
    def _on_head(self, headers: Sequence[tuple[bytes | str, bytes | str]]) -> None:
        self.headers = {_text(k): _text(v) for k, v in headers}
        raw = self.headers.get(":status", "")
        if not (len(raw) == 3 and raw.isascii() and raw.isdigit() and 200 <= int(raw) < 600):
            raise AgentFailed(f"stream {self.id}: a bad :status {raw[:16]!r}")
        self.status = int(raw)
        self._head.set()

    def _on_data(self, data: bytes, flow_len: int) -> None:
        if self.status is None:
            raise AgentFailed(f"stream {self.id}: DATA before the response's HEADERS")
        self._body += data
        if len(self._body) > self._conn.limits.stream_window:
            raise AgentFailed(f"stream {self.id}: more unread data than its window")
        self._conn.windows.received(self, flow_len, len(data))
        self._arrived.set()

    def _on_end(self) -> None:
        self.ended = True
        self._arrived.set()
        self._head.set()

    def _on_reset(self, code: int) -> None:
        self.reset = StreamReset(self.id, code)
        self._arrived.set()
        self._head.set()

    def _check(self) -> None:
        self._conn.check()
        if self.reset is not None and not (self.ended and self._body_wanted):
            raise self.reset

    # -- the caller's side ------------------------------------------------------------
    async def response(self) -> int:
        """Wait for the response's head; its status."""
        self._body_wanted = True
        while self.status is None:
            self._check()
            if self.ended:
                raise AgentFailed(f"stream {self.id}: ended without a response")
            self._head.clear()
            await self._head.wait()
        return self.status

    async def read(self, max_bytes: int = 64 * 1024) -> bytes:
        """The next bytes of the response body; b"" at its end."""
        self._body_wanted = True
        self._conn.check()  # a failed connection's data is not to be trusted either
        while not self._body:
            self._check()
            if self.ended:
                return b""
            self._arrived.clear()
            await self._arrived.wait()
        chunk = take_bytes(self._body, max_bytes)
        self._conn.windows.read(self, len(chunk))
        await self._conn.flush()
        return chunk

    async def read_all(self, limit: int) -> bytes:
        """The whole body; an agent that sends more than ``limit`` fails the connection."""
        out = bytearray()
        while chunk := await self.read():
            out += chunk
            if len(out) > limit:
                self.cancel()
                raise self._conn.fail(f"stream {self.id}: a response body over {limit} bytes")
        return bytes(out)

    async def send(self, data: bytes, end: bool = False) -> None:
        """Send request body bytes as the agent's window allows."""
        view = memoryview(data)
        while view:
            window = await self._conn.window(self)
            chunk, view = view[:window], view[window:]
            try:
                self._conn.h2.send_data(self.id, bytes(chunk), end_stream=end and not view)
            except h2.exceptions.StreamClosedError:
                raise StreamReset(self.id, 0) from None
            await self._conn.flush()
            if end and not view:
                self.sent_end = True
                return
        if end:
            self._check()
            try:
                self._conn.h2.end_stream(self.id)
            except h2.exceptions.StreamClosedError:
                raise StreamReset(self.id, 0) from None
            self.sent_end = True
            await self._conn.flush()

    def cancel(self) -> None:
        """Give the stream up (RST_STREAM CANCEL) and hand back what it holds unread."""
        if self.closed:
            return
        self.closed = True
        self._conn.forget(self)
        if self.ended and self.sent_end:
            return  # complete both ways: nothing to cancel
        if self.reset is None and not self._conn.failed_reason:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._conn.h2.reset_stream(self.id, h2.errors.ErrorCodes.CANCEL)
            self._conn.flush_soon()


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class _Budget:
    """A token bucket for frames that carry nothing for a live stream."""

    def __init__(self, burst: int, per_s: float) -> None:
        self.burst, self.per_s = burst, per_s
        self.tokens = float(burst)
        self.at = time.monotonic()

    def spend(self, n: int) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_s) - n
        self.at = now
        return self.tokens >= 0


class AgentConnection:
    """The h2 client state of one agent stream and the task that reads it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: AgentLimits,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.limits = limits
        self.h2 = new_connection(
            client_side=True, header_encoding=None,
            max_header_list_size=limits.max_header_list_size,
            max_frame_size=limits.max_frame_size, stream_window=limits.stream_window,
        )
        self._guard = FrameGuard(limits.max_frame_size, limits.max_header_block)
        self._budget = _Budget(limits.junk_burst, limits.junk_per_s)
        self._streams: dict[int, AgentStream] = {}
        self._changed = asyncio.Event()  # a window, a stream slot or the connection state
        self._settings = asyncio.Event()  # the agent's first SETTINGS arrived
        self.failed_reason: str | None = None
        self.windows = InboundWindows(
            self.h2, limits.stream_window, limits.connection_window, limits.buffer_budget,
            live=lambda: self.failed_reason is None,
        )
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # close() waits for the agent's end of the stream
        writer.transport.set_write_buffer_limits(high=256 * 1024)

    async def start(self) -> None:
        self.h2.initiate_connection()
        extra = self.limits.connection_window - 65535
        if extra > 0:
            self.h2.increment_flow_control_window(extra)
        self._task = asyncio.create_task(self._read_loop())
        await self.flush()
        try:
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                await self._settings.wait()
        except TimeoutError:
            raise self.fail(
                f"no HTTP/2 SETTINGS within {self.limits.handshake_timeout_s} s"
            ) from None
        self.check()

    # -- failure ---------------------------------------------------------------------
    def fail(self, reason: str) -> AgentFailed:
        """Mark the connection failed (first reason wins) and wake every waiter."""
        if self.failed_reason is None:
            self.failed_reason = reason
            self._changed.set()
            self._settings.set()  # the handshake stops waiting too
            for stream in list(self._streams.values()):
                stream._arrived.set()
                stream._head.set()
            self._writer.transport.abort()
            if self._task is not None and self._task is not asyncio.current_task():
                self._task.cancel()
        return AgentFailed(self.failed_reason)

    def check(self) -> None:
        if self.failed_reason is not None:
            raise AgentFailed(self.failed_reason)

    async def close(self, wait_for_agent: bool = False) -> None:
        """Hang up. ``wait_for_agent``: first wait a moment for the agent to close its end.

        A checkpoint wants that: CRIU refuses a sandbox whose socket still names a peer
        outside it, so our end gone is not enough; the agent closes its own (and the
        DevTools and VNC connections it relays) once it reads our GOAWAY. An agent that
        does not in ``close_timeout_s`` is cut off, and the checkpoint then names the
        socket left. Not waiting is for a sandbox that may be frozen or killed, and for a
        stream that the agent's close does not end (a VM's port, which QEMU holds open)."""
        if self.failed_reason is None:
            with contextlib.suppress(h2.exceptions.H2Error):
                self.h2.close_connection()
            self.flush_soon()
            if wait_for_agent and self._task is not None:
                self._closing = True
                await asyncio.wait({self._task}, timeout=self.limits.close_timeout_s)
            self.fail("the connection was closed by the host")
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- writing ---------------------------------------------------------------------
    def flush_soon(self) -> None:
        data = self.h2.data_to_send()
        # A transport the loop closed (the sandbox killed, its end reset) before our read
        # loop has seen it: uvloop raises on a write there, asyncio drops it. Nothing can
        # reach the agent any more; the read loop fails the connection on its next turn.
        if data and self.failed_reason is None and not self._writer.is_closing():
            self._writer.write(data)

    async def flush(self) -> None:
        self.flush_soon()
        if not self._writer.transport.get_write_buffer_size():
            self.check()
            return  # all of it went to the socket: nothing to wait for
        try:
            async with asyncio.timeout(self.limits.write_timeout_s):
                await self._writer.drain()
        except TimeoutError:
            raise self.fail(
                f"the agent read nothing for {self.limits.write_timeout_s} s"
            ) from None
        except (ConnectionError, OSError) as e:
            raise self.fail(f"the stream broke: {e!r}") from None
        self.check()

    async def window(self, stream: AgentStream) -> int:
        while True:
            stream._check()
            try:
                window = min(
                    self.h2.local_flow_control_window(stream.id), self.h2.max_outbound_frame_size
                )
            except h2.exceptions.StreamClosedError:
                raise StreamReset(stream.id, 0) from None
            if window > 0:
                return window
            self._changed.clear()
            await self._changed.wait()

    async def open(
        self, method: str, path: str, headers: Sequence[tuple[str, str]] = (), end: bool = True,
        flush: bool = True,
    ) -> AgentStream:
        """A new stream with the request's head sent (END_STREAM when ``end``); without
        ``flush`` the head waits for the body's first write (one syscall for both)."""
        while True:
            self.check()
            allowed = min(self.limits.max_streams, self.h2.remote_settings.max_concurrent_streams)
            if self.h2.open_outbound_streams < allowed:
                break
            self._changed.clear()
            await self._changed.wait()
        stream_id = self.h2.get_next_available_stream_id()
        stream = AgentStream(self, stream_id)
        self._streams[stream_id] = stream
        head = [(":method", method), (":scheme", "http"), (":authority", "agent"),
                (":path", path), *headers]
        self.h2.send_headers(stream_id, head, end_stream=end)
        stream.sent_end = end
        if flush:
            await self.flush()
        return stream

    def forget(self, stream: AgentStream) -> None:
        if self._streams.pop(stream.id, None) is not None and not stream.ended:
            with contextlib.suppress(h2.exceptions.H2Error, KeyError):
                window = self.h2.streams[stream.id].inbound_flow_control_window
                if window > 0:
                    self._guard.expect_late(stream.id, window)
        if stream._body:  # unread data no longer counts against the budget
            self.windows.discarded(len(stream._body))
            stream._body.clear()
        self._changed.set()

    # -- reading ---------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(self.limits.read_chunk)
                if not data:
                    if self._closing:  # it hung up as asked (close)
                        return
                    raise self.fail("the agent closed the stream")
                frames_before = self._guard.frames
                empty_before = self._guard.empty_data
                late_before = self._guard.late_data
                control_before = self._guard.control
                try:
                    self._guard.feed(data)
                    # Control frames are charged before h2 spends time on them (a SETTINGS
                    # frame costs h2 far more to handle than its 9 bytes cost to send).
                    control = self._guard.control - control_before
                    if control and not self._budget.spend(control):
                        raise self.fail(FLOOD)
                    events = self.h2.receive_data(data)
                except FrameViolation as e:
                    raise self.fail(str(e)) from None
                except h2.exceptions.H2Error as e:
                    raise self.fail(f"HTTP/2 protocol error: {e}") from None
                # DATA the agent sent before it saw our reset of its stream, within the
                # window it had then: expected, and h2 drops it without an event.
                useful = self._guard.late_data - late_before
                try:
                    for event in events:
                        useful += self._dispatch(event)
                except AgentFailed as e:
                    raise self.fail(e.reason) from None
                self.windows.release()
                frames = self._guard.frames - frames_before - control
                junk = max(frames - useful, self._guard.empty_data - empty_before)
                if junk > 0 and not self._budget.spend(junk):
                    raise self.fail(FLOOD)
                await self.flush()
        except AgentFailed:
            pass
        except (ConnectionError, OSError) as e:
            self.fail(f"the stream broke: {e!r}")
        except Exception as e:
            # Whatever a check here missed: the session fails with a reason rather than
            # keep a connection that nobody reads, whose calls would wait out their
            # deadlines and whose byte channels would wait for ever.
            log.exception("reading the agent's stream")
            self.fail(f"the host could not read the agent's stream: {type(e).__name__}: {e}")

    def _dispatch(self, event: h2.events.Event) -> int:
        """Hand one event on; 1 when it carried something for a live stream."""
        stream = self._streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived):
            if stream is not None:
                stream._on_head(event.headers or [])
                if event.stream_ended is not None:
                    stream._on_end()
                return 1
        elif isinstance(event, h2.events.DataReceived):
            length = event.flow_controlled_length or 0
            if stream is None:
                self.windows.dropped(length)  # for a stream we gave up
                return 0
            stream._on_data(event.data or b"", length)
            return 1 if event.data else 0
        elif isinstance(event, h2.events.StreamEnded):
            if stream is not None:
                stream._on_end()
        elif isinstance(event, h2.events.StreamReset):
            if stream is not None:
                stream._on_reset(int(event.error_code or 0))
                self._changed.set()  # a writer waiting for this stream's window wakes up
                if not stream.ended:  # a complete response stays readable
                    self.forget(stream)
                return 1
        elif isinstance(event, h2.events.WindowUpdated):
            self._changed.set()
            return 1 if (event.delta or 0) >= 1024 else 0
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self._settings.set()
            self._changed.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise self.fail(
                f"the agent ended the connection (GOAWAY, code {event.error_code})"
            )
        return 0


def take_bytes(buffer: bytearray, size: int) -> bytes:
    """The first ``size`` bytes of ``buffer``, removed from it, copied once: a slice of a
    bytearray is a copy of its own (and, at a screenshot's size, fresh pages to fault in)."""
    if size >= len(buffer):
        out = bytes(buffer)
        buffer.clear()
        return out
    with memoryview(buffer) as view:
        out = bytes(view[:size])
    del buffer[:size]
    return out
