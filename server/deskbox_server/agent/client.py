"""The host's client of a sandbox's agent: the calls of protocol 1 (desktop_image/agent/
PROTOCOL.md) over one :class:`~.connection.AgentConnection`.

Every call has a timeout; when it passes, the call's stream is cancelled and
:class:`~deskbox_server.errors.Timeout` raised, and the connection goes on. What the agent
answers is checked against the protocol (types, sizes, record framing); an answer that
breaks it fails the connection with :class:`~deskbox_server.errors.AgentFailed`.
"""

from __future__ import annotations

import asyncio
import json
import re
import struct
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

from .. import untrusted_json
from ..errors import (
    AgentFailed,
    Capacity,
    Conflict,
    DeskboxError,
    Forbidden,
    InvalidRequest,
    NotFound,
    SessionFailed,
    Timeout,
)
from .callstream import CallStream
from .connection import AgentConnection, AgentStream, StreamReset
from .limits import AgentLimits

__all__ = [
    "PROTOCOL",
    "AgentClient",
    "CallResult",
    "Channel",
    "ExecChunk",
    "ExecStatus",
    "FileReader",
    "Hello",
    "Json",
]

PROTOCOL = 1
Json: TypeAlias = None | bool | int | float | str | list["Json"] | dict[str, "Json"]

_RECORD = struct.Struct(">cI")
_MAX_RECORD = 64 * 1024
_SMALL_BODY = 64 * 1024  # hello, health, exec status
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Hello:
    protocol: int
    agent: str
    calls: tuple[str, ...]


@dataclass(frozen=True)
class ExecChunk:
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ExecStatus:
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool


@dataclass(frozen=True)
class CallResult:
    content_type: str
    body: bytes

    def json(self) -> Json:
        try:
            value: Json = untrusted_json.loads(self.body)
        except ValueError as e:
            raise AgentFailed(f"a call answered with bad JSON: {e}") from None
        return value


def _clean(text: str, limit: int = 1024) -> str:
    return _CONTROL.sub("?", text)[:limit]


_BY_STATUS: dict[int, type[DeskboxError]] = {
    400: InvalidRequest, 403: Forbidden, 404: NotFound, 408: Timeout, 413: InvalidRequest,
    422: InvalidRequest, 429: Capacity, 502: Conflict, 504: Timeout,
}


def _error_for(status: int, raw: bytes) -> DeskboxError:
    """The error of an answer other than 200, from the protocol's error shape."""
    kind, message = f"status {status}", raw.decode(errors="replace") or "(no body)"
    action = None
    try:
        error = untrusted_json.loads(raw)["error"]
        kind, message = str(error["kind"]), str(error["message"])
        action = error.get("action")
    except (ValueError, KeyError, TypeError):
        pass
    failure = _BY_STATUS.get(status, SessionFailed)(
        f"agent: {_clean(kind, 32)}: {_clean(message)}")
    if type(action) is int and action >= 0:  # its batch's own bound is checked by the caller
        failure.action_index = action
    return failure


class Channel:
    """A raw byte channel to a socket inside the sandbox (read, write, half-close)."""

    def __init__(self, stream: AgentStream, name: str) -> None:
        self._stream = stream
        self.name = name

    async def read(self, max_bytes: int = 64 * 1024) -> bytes:
        """Bytes from the socket as they come; b"" once it closed its side."""
        try:
            return await self._stream.read(max_bytes)
        except StreamReset as e:
            raise ConnectionResetError(f"channel {self.name}: {e}") from None

    async def write(self, data: bytes) -> None:
        """Waits while the agent's window is full: HTTP/2 flow control is the buffer."""
        try:
            await self._stream.send(data)
        except StreamReset as e:
            raise ConnectionResetError(f"channel {self.name}: {e}") from None

    async def write_eof(self) -> None:
        await self._stream.send(b"", end=True)

    def close(self) -> None:
        self._stream.cancel()


class FileReader:
    """A file being read from the agent, streamed: ``size`` (its content-length) first,
    then :meth:`chunks`; :meth:`close` it whatever happens."""

    def __init__(
        self, conn: AgentConnection, stream: AgentStream, size: int, read_timeout_s: float
    ) -> None:
        self._conn = conn
        self._stream = stream
        self.size = size
        self._read_timeout_s = read_timeout_s

    async def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes as they come: at most ``size`` (a file that shrank while it was
        read gives fewer); an agent that sends more fails the connection."""
        received = 0
        try:
            while True:
                async with asyncio.timeout(self._read_timeout_s):
                    chunk = await self._stream.read()
                if not chunk:
                    return
                received += len(chunk)
                if received > self.size:
                    raise self._conn.fail(
                        f"files: more than the {self.size} bytes announced")
                yield chunk
        except TimeoutError:
            raise Timeout("the agent stopped sending the file") from None
        except StreamReset as e:
            raise SessionFailed(f"agent: files: {e}") from None

    def close(self) -> None:
        self._stream.cancel()


class AgentClient:
    """The calls of protocol 1. Create with :meth:`connect` (it does the handshake)."""

    def __init__(self, conn: AgentConnection, hello: Hello) -> None:
        self._conn = conn
        self.hello_info = hello
        self._calls = CallStream(conn, _error_for)
        self._deadlines: set[asyncio.Timeout] = set()  # of the calls made through call()

    @classmethod
    async def connect(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        limits: AgentLimits | None = None,
    ) -> AgentClient:
        """Start HTTP/2 and say hello; refuses an agent of another protocol version."""
        conn = AgentConnection(reader, writer, limits or AgentLimits())
        try:
            await conn.start()
            client = cls(conn, Hello(0, "", ()))
            hello = await client.hello(timeout_s=conn.limits.handshake_timeout_s)
        except Timeout as e:
            raise conn.fail(f"no answer to hello: {e.message}") from None
        except AgentFailed:
            raise
        except DeskboxError as e:  # an error status, a reset: not an agent we can use
            raise conn.fail(f"hello failed: {e.message}") from None
        except BaseException:
            conn.fail("the handshake was interrupted")
            raise
        if hello.protocol != PROTOCOL:
            raise conn.fail(
                f"the agent speaks protocol {hello.protocol} (agent {_clean(hello.agent, 64)!r}),"
                f" this server speaks protocol {PROTOCOL}"
            )
        client.hello_info = hello
        return client

    @classmethod
    async def connect_unix(cls, path: str, limits: AgentLimits | None = None) -> AgentClient:
        limits = limits or AgentLimits()
        try:
            async with asyncio.timeout(limits.handshake_timeout_s):
                reader, writer = await asyncio.open_unix_connection(path, limit=limits.read_chunk)
        except (OSError, TimeoutError) as e:
            raise AgentFailed(f"cannot connect to {path}: {e!r}") from None
        return await cls.connect(reader, writer, limits)

    @property
    def failed_reason(self) -> str | None:
        return self._conn.failed_reason

    async def close(self, wait_for_agent: bool = False) -> None:
        """Hang up (``wait_for_agent``: see AgentConnection.close)."""
        # The connection first: failing it wakes a call waiting on the call stream, which
        # dropping the stream first would leave waiting (it is no longer one of the
        # connection's streams then).
        await self._conn.close(wait_for_agent)
        self._calls.close()

    def fail(self, reason: str) -> AgentFailed:
        """Fail the whole connection (a malformed answer of a call built on this client)."""
        return self._conn.fail(reason)

    # -- plumbing --------------------------------------------------------------------
    async def _request(
        self, method: str, path: str, body: bytes | None, timeout_s: float | None,
        max_body: int, content_type: str = "application/json",
    ) -> CallResult:
        if timeout_s is None:
            timeout_s = self._conn.limits.call_timeout_s
        stream: AgentStream | None = None
        try:
            async with asyncio.timeout(timeout_s):
                headers = [("content-type", content_type)] if body is not None else []
                stream = await self._conn.open(method, path, headers, end=body is None,
                                               flush=body is None)
                if body is not None:
                    await stream.send(body, end=True)
                await self._check_status(stream)
                data = await stream.read_all(max_body)
                return CallResult(stream.headers.get("content-type", ""), data)
        except TimeoutError:
            raise Timeout(f"the agent did not answer {method} {path} in time") from None
        except StreamReset as e:
            if stream is not None and stream.ended:  # it answered (e.g. 413) and cut us off
                await self._check_status(stream)
            raise SessionFailed(f"agent: {method} {path}: {e}") from None
        finally:
            if stream is not None:
                stream.cancel()

    async def _check_status(self, stream: AgentStream) -> int:
        status = await stream.response()
        if status == 200:
            return status
        raw = await stream.read_all(self._conn.limits.max_error_body)
        raise _error_for(status, raw)

    @staticmethod
    def _object(result: CallResult) -> dict[str, Any]:
        value = result.json()
        if not isinstance(value, dict):
            raise AgentFailed("a call answered with something other than a JSON object")
        return value

    # -- the calls -------------------------------------------------------------------
    async def hello(self, timeout_s: float | None = None) -> Hello:
        value = self._object(await self._request("GET", "/v1/hello", None, timeout_s, _SMALL_BODY))
        protocol, agent, calls = value.get("protocol"), value.get("agent"), value.get("calls", [])
        if not (isinstance(protocol, int) and not isinstance(protocol, bool)
                and isinstance(agent, str) and isinstance(calls, list)
                and all(isinstance(c, str) for c in calls)):
            raise self._conn.fail("hello: not {protocol: int, agent: str, calls: [str]}")
        return Hello(protocol, agent, tuple(calls))

    async def health(self, timeout_s: float | None = None) -> float:
        """The agent's uptime in seconds when it answers that it is well."""
        value = self._object(await self._request("GET", "/v1/health", None, timeout_s, _SMALL_BODY))
        uptime = value.get("uptime_s")
        if value.get("status") != "ok" or not isinstance(uptime, int | float):
            raise self._conn.fail("health: not {status: 'ok', uptime_s: number}")
        return float(uptime)

    async def call(
        self, name: str, args: Mapping[str, Json] | None = None, timeout_s: float | None = None,
        max_body: int | None = None,
    ) -> CallResult:
        """A registered handler of the agent, through the call stream (``POST /v1/calls``):
        calls take turns on it, in the order they are made. ``timeout_s`` counts from the
        call's turn: a call queued behind a long one (a batch's minute of ``wait``) is not
        cut short by its wait in line, which the calls ahead bound with their own deadlines."""
        body = json.dumps(args or {}, separators=(",", ":")).encode()
        seconds = timeout_s or self._conn.limits.call_timeout_s
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as deadline:
                self._deadlines.add(deadline)

                def its_turn() -> None:
                    if deadline.when() is None:  # else end_calls_now already ended it
                        deadline.reschedule(loop.time() + seconds)

                try:
                    content_type, data = await self._calls.call(
                        name, body, max_body or self._conn.limits.max_rpc_body, its_turn)
                finally:
                    self._deadlines.discard(deadline)
        except TimeoutError:
            raise Timeout(f"the agent did not answer the call {name} in time") from None
        except StreamReset as e:
            raise SessionFailed(f"agent: call {name}: {e}") from None
        return CallResult(content_type, data)

    def end_calls_now(self) -> None:
        """Every call of :meth:`call` waiting now, in line or for its reply, is past its
        deadline at once (its caller knows the agent cannot answer for a while: its sandbox
        was paused behind our back)."""
        now = asyncio.get_running_loop().time()
        for deadline in self._deadlines:
            if not deadline.expired():  # one that fired is on its way out: left alone
                deadline.reschedule(now)

    async def call_alone(
        self, name: str, args: Mapping[str, Json] | None = None, timeout_s: float | None = None,
        max_body: int | None = None,
    ) -> CallResult:
        """``POST /v1/call/<name>``: the call on a stream of its own, beside the call
        stream (one that waits long, such as the desktop's ``ready``)."""
        body = json.dumps(args or {}, separators=(",", ":")).encode()
        return await self._request("POST", f"/v1/call/{quote(name, safe='')}", body, timeout_s,
                                   max_body or self._conn.limits.max_rpc_body)

    async def exec(
        self, cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
        cwd: str | None = None, timeout_s: float = 30.0, max_output: int = 1 << 20,
        stop_grace_s: float = 0.0,
    ) -> AsyncIterator[ExecChunk | ExecStatus]:
        """Run a command in the sandbox: its output as it comes, then how it ended.

        The agent kills the command's process group at ``timeout_s`` (or when this
        iterator is closed early); with ``stop_grace_s`` it sends SIGTERM first and
        SIGKILL that much later. The whole call is bounded by those plus a grace. Output
        beyond ``max_output`` per stream is dropped by the agent; an agent that sends more
        than that fails the connection.
        """
        request: dict[str, object] = {"cmd": list(cmd), "env": dict(env or {}), "cwd": cwd,
                                      "timeout_s": timeout_s, "max_output": max_output}
        if stop_grace_s:
            request["stop_grace_s"] = stop_grace_s
        deadline = (asyncio.get_running_loop().time() + timeout_s + stop_grace_s
                    + self._conn.limits.exec_grace_s)
        stream: AgentStream | None = None
        try:
            async with asyncio.timeout_at(deadline):
                stream = await self._conn.open("POST", "/v1/exec",
                                               [("content-type", "application/json")], end=False,
                                               flush=False)
                await stream.send(json.dumps(request).encode(), end=True)
                await self._check_status(stream)
            buffer = bytearray()
            sizes = {b"o": 0, b"e": 0}
            while True:
                async with asyncio.timeout_at(deadline):
                    # Each record's head is checked as soon as it is there, whether its
                    # payload is still on its way or came in the same read.
                    while len(buffer) < _RECORD.size or len(buffer) < _RECORD.size + (
                        self._record_head(buffer)[1]
                    ):
                        chunk = await stream.read()
                        if not chunk:
                            raise self._conn.fail("exec: the output ended without a status")
                        buffer += chunk
                kind, length = self._record_head(buffer)
                payload = bytes(buffer[_RECORD.size : _RECORD.size + length])
                del buffer[: _RECORD.size + length]
                if kind == b"x":
                    status = self._exec_status(payload)
                    async with asyncio.timeout_at(deadline):  # END_STREAM must follow
                        if buffer or await stream.read(1):
                            raise self._conn.fail("exec: bytes after the status record")
                    yield status
                    return
                sizes[kind] += length
                if sizes[kind] > max_output:
                    raise self._conn.fail(f"exec: more output than the {max_output} asked for")
                yield ExecChunk("stdout" if kind == b"o" else "stderr", payload)
        except TimeoutError:
            raise Timeout(
                f"exec of {_clean(cmd[0], 64)!r}: the agent did not finish in time") from None
        except StreamReset as e:
            raise SessionFailed(f"agent: exec: {e}") from None
        finally:
            if stream is not None:
                stream.cancel()

    def _record_head(self, buffer: bytearray) -> tuple[bytes, int]:
        """The kind and length of the exec record at the start of ``buffer``, if valid."""
        kind, length = _RECORD.unpack_from(buffer)
        if kind not in (b"o", b"e", b"x") or length > _MAX_RECORD:
            raise self._conn.fail(f"exec: a bad record (kind {kind!r}, {length} bytes)")
        return kind, length

    def _exec_status(self, payload: bytes) -> ExecStatus:
        try:
            value = untrusted_json.loads(payload)
            status = ExecStatus(
                value["exit_code"], value["signal"], value["timed_out"],
                value["stdout_truncated"], value["stderr_truncated"],
            )
        except (ValueError, KeyError, TypeError):
            raise self._conn.fail("exec: a bad status record") from None
        ints = (status.exit_code, status.signal)
        bools = (status.timed_out, status.stdout_truncated, status.stderr_truncated)
        if not (all(i is None or (type(i) is int and 0 <= i < 256) for i in ints)
                and all(type(b) is bool for b in bools)):
            raise self._conn.fail("exec: a bad status record")
        return status

    async def read_file(
        self, path: str, max_bytes: int, timeout_s: float | None = None
    ) -> bytes:
        """A whole file of the sandbox, at most ``max_bytes`` (the agent refuses more)."""
        result = await self._request(
            "GET", f"/v1/files?path={quote(path, safe='/')}&max={max_bytes}", None, timeout_s,
            max_bytes)
        return result.body

    async def open_file(
        self, path: str, max_bytes: int, timeout_s: float | None = None
    ) -> FileReader:
        """Start reading a file of the sandbox (at most ``max_bytes``, else the agent
        refuses); its bytes stream through :class:`FileReader`, each read within
        ``timeout_s``."""
        timeout_s = timeout_s or self._conn.limits.call_timeout_s
        target = f"/v1/files?path={quote(path, safe='/')}&max={max_bytes}"
        stream: AgentStream | None = None
        try:
            async with asyncio.timeout(timeout_s):
                stream = await self._conn.open("GET", target, [], end=True, flush=True)
                await self._check_status(stream)
        except BaseException as error:
            if stream is not None:
                stream.cancel()
            if isinstance(error, TimeoutError):
                raise Timeout(f"reading {_clean(path, 128)!r}: the agent did not answer") from None
            if isinstance(error, StreamReset):
                raise SessionFailed(f"agent: files: {error}") from None
            raise
        length = stream.headers.get("content-length", "")
        if not (length.isascii() and length.isdigit() and len(length) <= 19
                and int(length) <= max_bytes):
            stream.cancel()
            raise self._conn.fail(f"files: a bad content-length {_clean(length, 32)!r}")
        return FileReader(self._conn, stream, int(length), timeout_s)

    async def write_file(
        self, path: str, data: bytes | AsyncIterable[bytes], mode: int | None = 0o644,
        max_bytes: int = 1 << 30, timeout_s: float | None = None,
    ) -> int:
        """Write a file in the sandbox (replaced whole, only once every byte arrived).

        ``mode`` None: a file replaced keeps its mode, a new one gets 644."""
        target = f"/v1/files?path={quote(path, safe='/')}&max={max_bytes}"
        if mode is not None:
            target += f"&mode={mode:o}"
        stream: AgentStream | None = None
        try:
            async with asyncio.timeout(timeout_s or self._conn.limits.call_timeout_s):
                stream = await self._conn.open(
                    "PUT", target, [("content-type", "application/octet-stream")], end=False)
                if isinstance(data, bytes):
                    await stream.send(data, end=True)
                else:
                    async for chunk in data:
                        await stream.send(chunk)
                    await stream.send(b"", end=True)
                await self._check_status(stream)
                value = untrusted_json.loads(await stream.read_all(_SMALL_BODY))
        except TimeoutError:
            raise Timeout(f"writing {_clean(path, 128)!r}: the agent did not answer") from None
        except StreamReset:
            # The agent stopped the upload early (over its cap): its answer says why.
            if stream is not None and stream.ended:
                await self._check_status(stream)
            raise SessionFailed("agent: the upload was reset") from None
        except ValueError:
            raise self._conn.fail("files: a bad answer to a write") from None
        finally:
            if stream is not None:
                stream.cancel()
        size = value.get("size") if isinstance(value, dict) else None
        if type(size) is not int:
            raise self._conn.fail("files: a bad answer to a write")
        return size

    async def _channel(self, path: str, name: str, timeout_s: float | None) -> Channel:
        stream: AgentStream | None = None
        try:
            async with asyncio.timeout(timeout_s or self._conn.limits.call_timeout_s):
                stream = await self._conn.open(
                    "POST", path, [("content-type", "application/octet-stream")], end=False)
                await self._check_status(stream)
        except TimeoutError:
            if stream is not None:
                stream.cancel()
            raise Timeout(f"channel {name}: the agent did not answer") from None
        except BaseException:
            if stream is not None:
                stream.cancel()
            raise
        return Channel(stream, name)

    async def open_tcp(self, port: int, timeout_s: float | None = None) -> Channel:
        """A channel to 127.0.0.1:``port`` inside the sandbox (the browser's DevTools)."""
        if not 0 < port < 65536:
            raise InvalidRequest(f"no TCP port {port}")
        return await self._channel(f"/v1/channels/tcp/{port}", f"tcp:{port}", timeout_s)

    async def open_unix(self, path: str, timeout_s: float | None = None) -> Channel:
        """A channel to a unix socket inside the sandbox (the VNC server)."""
        return await self._channel(
            f"/v1/channels/unix?path={quote(path, safe='/')}", f"unix:{path}", timeout_s)
