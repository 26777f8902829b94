"""A QMP client (QEMU's JSON machine protocol) over the VM's unix socket.

QEMU runs a guest we do not trust, so its answers are bounded like the agent's: a line
longer than :data:`MAX_LINE` or anything but a JSON object ends the connection, and every
command and every wait has a deadline. Events are kept (the last :data:`MAX_EVENTS`) with
a sequence number, so a caller can note :meth:`QmpClient.event_mark` before it acts and
then wait for an event that came after it, without a race.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import json
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ...errors import DesktopFailed, Timeout
from .runtime_files import socket_address

__all__ = ["QmpClient", "QmpError"]

MAX_LINE = 1 << 20
MAX_EVENTS = 256
DEFAULT_TIMEOUT_S = 30.0

Json = dict[str, Any]


class QmpError(DesktopFailed):
    """QEMU refused a command, or its QMP connection broke."""


class QmpRefused(QmpError):
    """The QMP socket refused the connection: nothing listens on it (yet, or any more)."""


class QmpClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._events: deque[tuple[int, Json]] = deque(maxlen=MAX_EVENTS)
        self._event_seq = 0
        self._event_arrived = asyncio.Event()
        self._broken: str | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, path: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> QmpClient:
        """Connect, read QEMU's greeting and leave negotiation mode."""
        # asyncio.timeout, never wait_for, in this module: Python 3.11's wait_for can swallow
        # a cancellation that arrives as what it awaits completes (gh-86296), and a delete
        # of a booting VM then waited out the whole boot (a cancelled start went on).
        try:
            # QEMU's user owns the socket's directory: not through whatever it put there.
            with socket_address(path) as address:
                async with asyncio.timeout(timeout_s):
                    reader, writer = await asyncio.open_unix_connection(address,
                                                                        limit=MAX_LINE)
        except (OSError, TimeoutError) as error:
            kind = QmpRefused if isinstance(error, ConnectionRefusedError) else QmpError
            raise kind(f"cannot connect to QEMU's QMP socket {path}: {error!r}") from None
        client = cls(reader, writer)
        try:
            async with asyncio.timeout(timeout_s):
                greeting = await client._read()
            if "QMP" not in greeting:
                raise QmpError(f"QEMU's QMP socket greeted with {str(greeting)[:200]}")
            client._task = asyncio.create_task(client._read_loop(), name=f"qmp {path.name}")
            await client.execute("qmp_capabilities", timeout_s=timeout_s)
        except BaseException:
            await client.close()
            raise
        return client

    async def _read(self) -> Json:
        try:
            line = await self._reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise QmpError(f"QEMU sent a QMP line over {MAX_LINE} bytes") from None
        except OSError as error:
            raise QmpError(f"QEMU's QMP connection broke: {error!r}") from None
        if not line:
            raise QmpError("QEMU closed its QMP connection (it exited)")
        try:
            message = json.loads(line)
        except ValueError:
            raise QmpError(f"QEMU sent a QMP line that is not JSON: {line[:200]!r}") from None
        if not isinstance(message, dict):
            raise QmpError(f"QEMU sent a QMP message that is not an object: {line[:200]!r}")
        return message

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await self._read()
                if "event" in message:
                    self._event_seq += 1
                    self._events.append((self._event_seq, message))
                    self._event_arrived.set()
                    self._event_arrived = asyncio.Event()
                    continue
                reply_id = message.get("id")
                future = self._pending.pop(reply_id, None) if isinstance(reply_id, int) else None
                if future is None or future.done():
                    continue  # an answer nobody waits for (it timed out)
                if "error" in message:
                    error = message["error"]
                    detail = error.get("desc") if isinstance(error, dict) else error
                    future.set_exception(QmpError(f"QEMU refused: {str(detail)[:500]}"))
                else:
                    future.set_result(message.get("return"))
        except QmpError as error:
            self._fail(str(error))
        except asyncio.CancelledError:
            self._fail("the QMP connection was closed")
            raise

    def _fail(self, reason: str) -> None:
        self._broken = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(QmpError(reason))
        self._pending.clear()
        self._event_arrived.set()

    async def execute(
        self, command: str, arguments: Mapping[str, Any] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """Run ``command``; its ``return`` value, QmpError if QEMU refused it."""

        async def send(message: bytes) -> None:
            self._writer.write(message)
            await self._writer.drain()

        return await self._request(command, arguments, timeout_s, send)

    async def send_fd(self, name: str, fd: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Hand QEMU the descriptor ``fd`` under ``name`` (QMP ``getfd``), for ``fd:name``
        URIs such as a migration into a file we opened: QEMU itself opens nothing."""
        transport_socket = self._writer.get_extra_info("socket")

        async def send(message: bytes) -> None:
            await self._writer.drain()  # nothing of ours is queued before the message
            # asyncio's socket wrapper offers no sendmsg: a duplicate of the descriptor does
            # (SCM_RIGHTS needs the descriptor to ride on the command's own bytes). The two
            # share one open file, O_NONBLOCK included: made blocking here, the transport's
            # socket would stay blocking, and a QEMU that stops reading would stall the loop.
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
            with socket.socket(fileno=os.dup(transport_socket.fileno())) as raw:
                raw.setblocking(False)
                while True:
                    try:
                        sent = raw.sendmsg([message], rights)
                        break
                    except BlockingIOError:
                        await _writable(raw)
            if sent < len(message):  # the descriptor went with the first part
                self._writer.write(message[sent:])

        await self._request("getfd", {"fdname": name}, timeout_s, send)

    async def _request(
        self, command: str, arguments: Mapping[str, Any] | None, timeout_s: float,
        send: Callable[[bytes], Awaitable[None]],
    ) -> Any:
        if self._broken is not None:
            raise QmpError(self._broken)
        command_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        message: Json = {"execute": command, "id": command_id}
        if arguments:
            message["arguments"] = dict(arguments)
        try:
            async with asyncio.timeout(timeout_s):  # a QEMU that stops reading too
                await send(json.dumps(message).encode() + b"\n")
                return await future
        except TimeoutError:
            raise Timeout(f"QEMU did not answer {command} within {timeout_s:.0f} s") from None
        except OSError as error:
            raise QmpError(f"QEMU's QMP connection broke: {error!r}") from None
        finally:
            self._pending.pop(command_id, None)

    def event_mark(self) -> int:
        """The sequence number of the last event so far: wait for ones after it."""
        return self._event_seq

    async def wait_event(
        self, name: str, timeout_s: float, since: int = 0,
        data: Mapping[str, Any] | None = None,
    ) -> Json:
        """The first event ``name`` after ``since`` whose data holds ``data``; Timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for seq, event in self._events:
                if seq > since and event.get("event") == name and _holds(event, data):
                    return event
            if self._broken is not None:
                raise QmpError(f"waiting for QEMU's {name}: {self._broken}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise Timeout(f"QEMU reported no {name} within {timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._event_arrived.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        else:
            self._fail("the QMP connection was closed")
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


async def _writable(sock: socket.socket) -> None:
    """Until ``sock`` can take more bytes (the command's deadline bounds the wait)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_writer(sock, wake)
    try:
        await ready
    finally:
        loop.remove_writer(sock)


def _holds(event: Json, data: Mapping[str, Any] | None) -> bool:
    if not data:
        return True
    found = event.get("data")
    return isinstance(found, dict) and all(found.get(k) == v for k, v in data.items())
