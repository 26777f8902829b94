"""The host's end of ``POST /v1/calls``: named calls, one after another, over one stream.

Each call is a length-prefixed JSON message in the request body; each reply a
length-prefixed JSON head (status, content type, size) and the body (PROTOCOL.md). The
agent's replies are hostile like everything it sends: the head is bounded and checked,
the body must fit the caller's bound, and a reply that breaks the framing fails the whole
connection. A call that times out or is cancelled leaves the stream in an unknown place:
the stream is dropped (RST_STREAM) and the next call opens a new one.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable

from .. import untrusted_json
from ..errors import DeskboxError
from .connection import AgentConnection, AgentStream, take_bytes

__all__ = ["CALLS_TYPE", "MAX_REPLY_HEAD", "CallStream"]

CALLS_TYPE = "application/vnd.deskbox.calls"
MAX_REPLY_HEAD = 4096  # the agent's reply heads are ~60 bytes
_LENGTH = struct.Struct(">I")
_MAX_CONTENT_TYPE = 128

# (status, content type, body) -> the error to raise for a status other than 200.
ErrorFor = Callable[[int, bytes], DeskboxError]


class CallStream:
    """Calls on one lazily opened stream; concurrent callers take turns (FIFO)."""

    def __init__(self, conn: AgentConnection, error_for: ErrorFor) -> None:
        self._conn = conn
        self._error_for = error_for
        self._lock = asyncio.Lock()
        self._stream: AgentStream | None = None
        self._buffer = bytearray()

    async def call(self, name: str, body: bytes, max_body: int,
                   its_turn: Callable[[], None] | None = None) -> tuple[str, bytes]:
        """The reply's (content type, body) to the call ``name`` with the JSON ``body`` of
        its arguments; the caller bounds the time (asyncio.timeout), and ``its_turn`` is
        called once the calls ahead are done (where its own deadline should start)."""
        message = b'{"call":' + json.dumps(name).encode() + b',"args":' + body + b"}"
        async with self._lock:
            if its_turn is not None:
                its_turn()
            try:
                stream = await self._open()
                await stream.send(_LENGTH.pack(len(message)) + message)
                (head_size,) = _LENGTH.unpack(await self._exactly(stream, _LENGTH.size))
                if head_size > MAX_REPLY_HEAD:
                    raise self._conn.fail(f"calls: a reply head of {head_size} bytes")
                status, content_type, size = self._head(await self._exactly(stream, head_size))
                if size > (max_body if status == 200 else self._conn.limits.max_error_body):
                    raise self._conn.fail(f"calls: {name}: a reply of {size} bytes (limit "
                                          f"{max_body})")
                data = await self._exactly(stream, size)
            except BaseException:
                self._drop()
                raise
        if status != 200:
            raise self._error_for(status, data)
        return content_type, data

    def close(self) -> None:
        self._drop()

    async def _open(self) -> AgentStream:
        if self._stream is None:
            stream = await self._conn.open("POST", "/v1/calls", [("content-type", CALLS_TYPE)],
                                           end=False, flush=False)
            self._stream = stream
            self._buffer.clear()
        return self._stream

    def _drop(self) -> None:
        stream, self._stream = self._stream, None
        self._buffer.clear()
        if stream is not None:
            stream.cancel()

    async def _exactly(self, stream: AgentStream, size: int) -> bytes:
        if len(self._buffer) < size and stream.status is None:
            status = await stream.response()
            content_type = stream.headers.get("content-type", "")
            if status != 200 or content_type != CALLS_TYPE:
                raise self._conn.fail(f"calls: answered {status} {content_type[:64]!r}")
        while len(self._buffer) < size:
            chunk = await stream.read(max(size - len(self._buffer), 64 * 1024))
            if not chunk:
                raise self._conn.fail("calls: the stream ended inside a reply")
            if not self._buffer and len(chunk) == size:
                return chunk  # a reply that had arrived whole: no copy more
            self._buffer += chunk
        return take_bytes(self._buffer, size)

    def _head(self, raw: bytes) -> tuple[int, str, int]:
        try:
            head = untrusted_json.loads(raw)
        except ValueError:
            head = None
        if isinstance(head, dict):
            status, content_type, size = head.get("status"), head.get("content_type"), \
                head.get("size")
            if (type(status) is int and 100 <= status <= 599 and isinstance(content_type, str)
                    and len(content_type) <= _MAX_CONTENT_TYPE and type(size) is int
                    and size >= 0):
                return status, content_type, size
        raise self._conn.fail("calls: a reply head is not {status, content_type, size}")
