"""``POST /v1/calls``: many named calls over one long-lived stream (PROTOCOL.md).

A call through ``POST /v1/call/<name>`` costs a stream of its own: its HEADERS both ways,
HPACK, the stream's state machine and a task here, about half of a small call's time in
pure-Python HTTP/2. The host's desktop calls (every click and screenshot) go through one
call stream instead, as length-prefixed messages in its DATA frames: the same framing
(HTTP/2), one request, answered in order.
"""

from __future__ import annotations

import asyncio
import json
import struct

from .h2server import Stream
from .limits import Limits
from .registry import Blob, CallError, Json, Registry, failure_answer

__all__ = ["CALLS_TYPE", "MAX_REPLY_HEAD", "invoke", "serve_calls"]

CALLS_TYPE = "application/vnd.deskbox.calls"
MAX_REPLY_HEAD = 4096
_LENGTH = struct.Struct(">I")
_Reply = tuple[int, str, bytes]


def _error(status: int, kind: str, message: str, action: int | None = None) -> _Reply:
    error: dict[str, Json] = {"kind": kind, "message": message[:1024]}
    if action is not None:
        error["action"] = action
    body = {"error": error}
    return status, "application/json", json.dumps(body, separators=(",", ":")).encode()


async def invoke(registry: Registry, name: str, args: object) -> _Reply:
    """Run the call ``name``: (status, content type, body), errors in the protocol's shape."""
    handler = registry.get(name)
    if handler is None:
        return _error(404, "unknown_call", f"no call named {name!r}")
    if not isinstance(args, dict):
        return _error(400, "bad_request", "the arguments must be a JSON object")
    try:
        result: Json | Blob = await handler(args)
    except CallError as e:
        return _error(e.status, e.kind, e.message, e.action)
    except Exception as e:  # a handler's bug fails its call only
        answer = failure_answer(e, f"call {name}")
        return _error(answer.status, answer.kind, answer.message)
    if isinstance(result, Blob):
        return 200, result.content_type, result.data
    return 200, "application/json", json.dumps(result, separators=(",", ":")).encode()


class _Messages:
    """Exact reads from a request body that carries length-prefixed messages."""

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def exactly(self, size: int) -> bytes | None:
        """``size`` bytes; None when the body ends cleanly before the first of them."""
        while len(self._buffer) < size:
            chunk = await self._stream.read(max(size - len(self._buffer), 64 * 1024))
            if not chunk:
                if self._buffer:
                    raise EOFError("the call stream ended inside a message")
                return None
            self._buffer += chunk
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    async def skip(self, size: int) -> None:
        """Read ``size`` bytes and keep none of them (bounded memory whatever the size)."""
        while size > len(self._buffer):
            size -= len(self._buffer)
            self._buffer.clear()
            chunk = await self._stream.read(min(size, 64 * 1024))
            if not chunk:
                raise EOFError("the call stream ended inside a message")
            self._buffer += chunk
        del self._buffer[:size]


async def serve_calls(stream: Stream, registry: Registry, limits: Limits) -> None:
    """Answer each call message in order until the host ends the request body."""
    await stream.respond(200, CALLS_TYPE)
    messages = _Messages(stream)
    while True:
        prefix = await messages.exactly(_LENGTH.size)  # idle between calls: no deadline
        if prefix is None:
            break
        (size,) = _LENGTH.unpack(prefix)
        try:
            async with asyncio.timeout(limits.request_body_timeout_s):
                too_large = size > limits.max_request_body
                if too_large:  # read past it, kept nowhere: the stream goes on
                    await messages.skip(size)
                    raw = b""
                else:
                    message = await messages.exactly(size)
                    if message is None:
                        raise EOFError("the call stream ended inside a message")
                    raw = message
        except (TimeoutError, EOFError):
            stream.abort()  # a message that does not arrive: nothing after it can be trusted
            return
        if too_large:
            reply = _error(413, "too_large",
                           f"the request body exceeds {limits.max_request_body} bytes")
        else:
            reply = await _answer(registry, raw)
        status, content_type, body = reply
        head = json.dumps({"status": status, "content_type": content_type, "size": len(body)},
                          separators=(",", ":")).encode()
        await stream.write(_LENGTH.pack(len(head)) + head + body)
    await stream.write(b"", end=True)


async def _answer(registry: Registry, raw: bytes) -> _Reply:
    try:
        message = json.loads(raw or b"")
    except ValueError as e:
        return _error(400, "bad_request", f"the call is not JSON: {e}")
    if not isinstance(message, dict) or not isinstance(message.get("call"), str):
        return _error(400, "bad_request", 'a call is {"call": name, "args": {...}}')
    return await invoke(registry, message["call"], message.get("args", {}))
