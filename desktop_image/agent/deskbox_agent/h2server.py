"""The HTTP/2 server side of the one stream: h2 (sans-I/O) driven by asyncio streams.

Each request becomes a :class:`Stream` given to the router in a task of its own. Bodies
are never buffered past HTTP/2 flow control: received DATA is acknowledged (its window
handed back to the host) only when a handler has read it, and a handler's writes wait for
the host's window. So a slow consumer on either side slows the other, and memory stays
within the windows of ``Limits``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, urlsplit

import h2.errors
import h2.events
import h2.exceptions

from .frames import FrameGuard, FrameViolation
from .h2setup import new_connection
from .limits import Limits
from .registry import failure_answer
from .windows import InboundWindows

__all__ = ["Connection", "Stream", "StreamGone", "serve_connection"]

log = logging.getLogger("deskbox_agent")

Handler = Callable[["Stream"], Awaitable[None]]


class StreamGone(Exception):
    """The host reset the stream or the connection ended: stop working for it."""


class Stream:
    """One request: its head, its body (read as it comes) and the response (sent likewise)."""

    def __init__(self, conn: Connection, stream_id: int, headers: dict[str, str]) -> None:
        self._conn = conn
        self.id = stream_id
        self.method = headers.get(":method", "")
        parts = urlsplit(headers.get(":path", ""))
        self.path = parts.path
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.headers = headers
        self._body = bytearray()
        self.owed = 0  # bytes read whose stream window is not handed back yet
        self._arrived = asyncio.Event()
        self.ended = False  # the host sent END_STREAM
        self.reset = False  # the host reset the stream, or the connection is gone
        self.responded = False
        self.closed = False  # we sent END_STREAM (or a reset)

    # -- receiving -------------------------------------------------------------------
    def _feed(self, data: bytes, flow_len: int) -> None:
        self._body += data
        self._conn.windows.received(self, flow_len, len(data))
        self._arrived.set()

    def _feed_eof(self) -> None:
        self.ended = True
        self._arrived.set()

    def _gone(self) -> None:
        self.reset = True
        self._arrived.set()

    async def read(self, max_bytes: int = 64 * 1024) -> bytes:
        """The next bytes of the request body; b"" at its end. Hands the window back."""
        while not self._body:
            if self.reset:
                raise StreamGone(f"stream {self.id} was reset")
            if self.ended:
                return b""
            self._arrived.clear()
            await self._arrived.wait()
        chunk = bytes(self._body[:max_bytes])
        del self._body[:max_bytes]
        self._conn.windows.read(self, len(chunk))
        await self._conn.flush()
        return chunk

    async def body(self, limit: int, timeout_s: float) -> bytes | None:
        """The whole body, or None when it is larger than ``limit`` (413 already sent)."""
        out = bytearray()
        async with asyncio.timeout(timeout_s):
            while chunk := await self.read():
                out += chunk
                if len(out) > limit:
                    await self.error(413, "too_large", f"the request body exceeds {limit} bytes")
                    return None
        return bytes(out)

    # -- sending ---------------------------------------------------------------------
    async def respond(
        self, status: int, content_type: str = "application/json", end: bool = False,
        extra: dict[str, str] | None = None, flush: bool = True,
    ) -> None:
        headers = [(":status", str(status)), ("content-type", content_type)]
        headers += list((extra or {}).items())
        self._check()
        self.responded = True
        self._conn.h2.send_headers(self.id, headers, end_stream=end)
        self.closed = end
        if flush:  # else the head goes out with the first DATA, in one write
            await self._conn.flush()

    async def write(self, data: bytes, end: bool = False) -> None:
        """Send ``data`` as the window allows (waits for the host to read)."""
        view = memoryview(data)
        while view:
            window = await self._conn.window(self)  # flushes what is queued before waiting
            chunk, view = view[:window], view[window:]
            self._conn.h2.send_data(self.id, chunk, end_stream=end and not view)
            self.closed = end and not view
        await self._conn.flush()  # all frames the window allowed in one write
        if end and not self.closed:
            self._check()
            self._conn.h2.end_stream(self.id)
            self.closed = True
            await self._conn.flush()

    async def json(self, status: int, value: object) -> None:
        await self.respond(status, flush=False)
        await self.write(json.dumps(value, separators=(",", ":")).encode(), end=True)

    async def error(self, status: int, kind: str, message: str) -> None:
        """The one error shape of the protocol; a reset if the head is already out."""
        if self.closed or self.reset:
            return
        if self.responded:
            self.abort()
            return
        await self.json(status, {"error": {"kind": kind, "message": message[:1024]}})

    def abort(self, code: int = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        if not (self.closed or self.reset):
            self.closed = True
            with contextlib.suppress(h2.exceptions.H2Error):
                self._conn.h2.reset_stream(self.id, code)
            self._conn.flush_soon()

    def _check(self) -> None:
        if self.reset:
            raise StreamGone(f"stream {self.id} was reset")


class Connection:
    """One host connection: the h2 state machine, its streams and their tasks."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler,
        limits: Limits,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self.limits = limits
        self.h2 = new_connection(
            client_side=False, header_encoding="utf-8",
            max_header_list_size=limits.max_header_list_size,
            max_frame_size=limits.max_frame_size, stream_window=limits.stream_window,
            max_concurrent_streams=limits.max_concurrent_streams,
        )
        self._guard = FrameGuard(
            limits.max_frame_size, limits.max_header_list_size * 2, preface=True
        )
        self._streams: dict[int, Stream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._task_of: dict[int, asyncio.Task[None]] = {}
        self._window_changed = asyncio.Event()
        self._dead = False
        # A socket that does not read stalls only its channel (windows.py).
        self.windows = InboundWindows(
            self.h2, limits.stream_window, limits.connection_window, limits.buffer_budget,
            live=lambda: not self._dead,
        )

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self._dead:
            self._writer.write(data)
            if not self._writer.transport.get_write_buffer_size():
                return  # all of it went to the socket: nothing to wait for
            try:
                await self._writer.drain()
            except (ConnectionError, OSError) as e:
                self._dead = True
                raise StreamGone("the host connection is gone") from e

    def flush_soon(self) -> None:
        data = self.h2.data_to_send()
        if data and not self._dead:
            self._writer.write(data)

    async def window(self, stream: Stream) -> int:
        """How many bytes ``stream`` may send now (> 0): waits for WINDOW_UPDATEs."""
        while True:
            stream._check()
            if self._dead:
                raise StreamGone("the host connection is gone")
            try:
                window = min(
                    self.h2.local_flow_control_window(stream.id), self.h2.max_outbound_frame_size
                )
            except h2.exceptions.StreamClosedError as e:
                raise StreamGone(f"stream {stream.id} is closed") from e
            if window > 0:
                return window
            # The event is shared by every stream that waits: a WINDOW_UPDATE that arrives
            # while this flush waits for the socket sets it, and another stream's writer may
            # clear it again before we wait. So the window is looked at again after the
            # flush, with no await between that look and the wait (a 3 MB reply beside
            # channels nobody read stalled for good; before that, 4 MB replies on their own
            # about once in 15).
            self._window_changed.clear()
            await self.flush()  # the host acknowledges only what it received
            try:
                if self.h2.local_flow_control_window(stream.id) > 0:
                    continue
            except h2.exceptions.StreamClosedError as e:
                raise StreamGone(f"stream {stream.id} is closed") from e
            await self._window_changed.wait()

    async def run(self) -> None:
        self.h2.initiate_connection()
        extra = self.limits.connection_window - 65535
        if extra > 0:
            self.h2.increment_flow_control_window(extra)
        try:
            await self.flush()
            first = True
            while not self._dead:
                if first:
                    async with asyncio.timeout(self.limits.settings_timeout_s):
                        data = await self._reader.read(self.limits.read_chunk)
                    first = False
                else:
                    data = await self._reader.read(self.limits.read_chunk)
                if not data:
                    break
                try:
                    self._guard.feed(data)
                    events = self.h2.receive_data(data)
                except FrameViolation as e:
                    log.warning("peer is not a host speaking HTTP/2: %s", e)
                    break
                except h2.exceptions.ProtocolError as e:
                    log.warning("host protocol error: %s", e)
                    self.flush_soon()
                    break
                for event in events:
                    self._dispatch(event)
                self.windows.release()
                await self.flush()
        except (TimeoutError, StreamGone, ConnectionError, OSError) as e:
            log.info("host connection ends: %r", e)
        finally:
            self._dead = True
            self._window_changed.set()
            for stream in self._streams.values():
                stream._gone()
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            sid = event.stream_id
            headers = {str(k): str(v) for k, v in event.headers or []}
            stream = Stream(self, sid, headers)
            self._streams[sid] = stream
            if event.stream_ended is not None:
                stream._feed_eof()
            task = asyncio.create_task(self._serve(stream))
            self._tasks.add(task)
            self._task_of[sid] = task
            task.add_done_callback(self._tasks.discard)
        elif isinstance(event, h2.events.DataReceived):
            target = self._streams.get(event.stream_id or 0)
            if target is None:
                self.windows.dropped(event.flow_controlled_length or 0)
            else:
                target._feed(event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.StreamEnded):
            if (target := self._streams.get(event.stream_id or 0)) is not None:
                target._feed_eof()
        elif isinstance(event, h2.events.StreamReset):
            if (target := self._streams.pop(event.stream_id or 0, None)) is not None:
                target._gone()
                self._window_changed.set()
                # The host gave the call up: stop its work (an exec's finally kills it).
                if (work := self._task_of.get(target.id)) is not None:
                    work.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window_changed.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._dead = True

    async def _serve(self, stream: Stream) -> None:
        try:
            await self._handler(stream)
            if not stream.closed:
                await stream.error(500, "internal", "the handler did not answer")
        except StreamGone:
            pass
        except TimeoutError:
            with contextlib.suppress(StreamGone):
                await stream.error(408, "timeout", "the request body did not arrive in time")
        except Exception as e:  # a handler's bug fails its stream only
            answer = failure_answer(e, f"handler of {stream.path}")
            with contextlib.suppress(StreamGone):
                await stream.error(answer.status, answer.kind, answer.message)
        except asyncio.CancelledError:
            if not stream.reset:
                raise
        finally:
            self._streams.pop(stream.id, None)
            self._task_of.pop(stream.id, None)
            # Whatever the host sent that nobody read still counts against the connection.
            if stream._body:
                self.windows.discarded(len(stream._body))
                stream._body.clear()
            if not stream.ended and not stream.reset and not self._dead:
                # Answered before the body ended: tell the host to stop sending it.
                with contextlib.suppress(h2.exceptions.H2Error):
                    self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.NO_ERROR)
            with contextlib.suppress(StreamGone):
                await self.flush()


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler,
    limits: Limits,
) -> None:
    await Connection(reader, writer, handler, limits).run()
