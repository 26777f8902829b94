"""RFB between a websocket viewer and the session's VNC server, with the viewer's input
filtered by its scope.

The proxy speaks each handshake itself: with the VNC server (RFB 3.8, security None: only
the host reaches its socket) before the websocket is accepted, then with the viewer
(RFB 3.3, 3.7 or 3.8, security None: the token was checked before the upgrade). It always
asks the server for a shared session, so viewers never disconnect each other. After
ClientInit the server's bytes pass through unchanged and the viewer's are framed and
filtered by :class:`~deskbox_server.vnc.rfb.ClientMessages`.

The server's bytes are always read at once into the viewer's outbox, never left in the VNC
server's socket: x11vnc writes to its clients one at a time, so a viewer that stops reading
would otherwise stall every other viewer of the session. A viewer whose outbox grows past
``max_buffer`` bytes, or that takes nothing for ``send_timeout_s``, is closed (1008); so is
one whose input the VNC server takes none of for ``send_timeout_s`` (a frozen session,
flooded): its handler, waiting to pass that input on, no longer read the viewer, and did
not see it leave until the session resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..errors import DeskboxError
from .rfb import SECURITY_NONE, ClientMessages, RfbError, client_version, parse_server_version

__all__ = ["CLOSE_TOO_SLOW", "HANDSHAKE_TIMEOUT_S", "ProxyStats", "handshake_server",
           "run_proxy"]

log = logging.getLogger("deskbox.vnc")

HANDSHAKE_TIMEOUT_S = 10.0
_CHUNK = 256 * 1024
_REASON_LIMIT = 1024
_CLOSE_POLICY = 1008
_CLOSE_SERVER_GONE = 1001  # going away: the session's screen is gone (1011 said "a bug")
_SERVER_GONE = ("the session's screen ended: it stopped, or a checkpoint closed its viewers "
                "(connect again to watch it)")
CLOSE_TOO_SLOW = _CLOSE_POLICY
_CLOSE_TIMEOUT_S = 1.0
_RELEASE_SETTLE_S = 0.25  # x11vnc's turn is ~20 ms (-wait); a few of them
# Between input passed to x11vnc and a key the agent types: x11vnc's turn, twice and more.
_BEFORE_AGENT_KEY_S = 0.05


@dataclass
class ProxyStats:
    to_viewer: int = 0
    to_server: int = 0
    messages: int = 0
    dropped: int = 0
    too_slow: bool = False  # closed because the viewer fell behind


class ViewerTooSlow(Exception):
    """The viewer took too little of what the VNC server sent (see run_proxy)."""


class InputNotTaken(Exception):
    """The VNC server took none of the viewer's input for a while (see run_proxy)."""


class _Outbox:
    """Bytes for the viewer, at most ``limit`` of them waiting."""

    def __init__(self, limit: int) -> None:
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._limit = limit
        self.waiting = 0

    def put(self, chunk: bytes) -> None:
        self.waiting += len(chunk)
        if self.waiting > self._limit:
            raise ViewerTooSlow(f"the viewer is more than {self._limit} bytes behind")
        self._chunks.put_nowait(chunk)

    def end(self) -> None:
        self._chunks.put_nowait(None)

    async def get(self) -> bytes | None:
        chunk = await self._chunks.get()
        if chunk is not None:
            self.waiting -= len(chunk)
        return chunk


async def _exactly(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise RfbError("the VNC server closed the connection during the handshake") from None


async def handshake_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Up to ServerInit (excluded): version 3.8, security None, result OK."""
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
        parse_server_version(await _exactly(reader, 12))
        writer.write(b"RFB 003.008\n")
        count = (await _exactly(reader, 1))[0]
        if count == 0:
            (length,) = struct.unpack(">I", await _exactly(reader, 4))
            reason = await _exactly(reader, min(length, _REASON_LIMIT))
            raise RfbError(f"the VNC server refused: {reason.decode(errors='replace')}")
        types = await _exactly(reader, count)
        if SECURITY_NONE not in types:
            raise RfbError(f"the VNC server offers no security type we use ({list(types)})")
        writer.write(bytes([SECURITY_NONE]))
        (result,) = struct.unpack(">I", await _exactly(reader, 4))
        if result != 0:
            raise RfbError("the VNC server refused the connection")


class _ViewerStream:
    """Bytes from the websocket's binary messages."""

    def __init__(self, websocket: WebSocket) -> None:
        self._websocket = websocket
        self._buffer = bytearray()

    async def _more(self) -> None:
        message = await self._websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(int(message.get("code", 1000)))
        data = message.get("bytes")
        if data is None:
            raise RfbError("viewers send RFB in binary messages, not text")
        self._buffer += data

    async def read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            await self._more()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def chunk(self) -> bytes:
        """Whatever has arrived (at least one message's worth)."""
        if not self._buffer:
            await self._more()
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


async def _handshake_viewer(websocket: WebSocket, viewer: _ViewerStream) -> None:
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
        await websocket.send_bytes(b"RFB 003.008\n")
        minor = client_version(await viewer.read(12))
        if minor == 3:
            await websocket.send_bytes(struct.pack(">I", SECURITY_NONE))
        else:
            await websocket.send_bytes(bytes([1, SECURITY_NONE]))
            choice = (await viewer.read(1))[0]
            if choice != SECURITY_NONE:
                if minor == 8:
                    reason = b"only security type None (1) is offered"
                    await websocket.send_bytes(struct.pack(">II", 1, len(reason)) + reason)
                raise RfbError(f"the viewer chose security type {choice}")
            if minor == 8:
                await websocket.send_bytes(struct.pack(">I", 0))
        await viewer.read(1)  # ClientInit: the server is always asked for a shared session


async def run_proxy(
    websocket: WebSocket,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    allow_input: bool,
    max_cut_text: int = 1 << 20,
    max_buffer: int = 32 << 20,
    send_timeout_s: float = 30.0,
    on_input: Callable[[bytes], None] | None = None,
    ends: Coroutine[Any, Any, str] | None = None,
    type_key: Callable[[int], Awaitable[bool]] | None = None,
) -> ProxyStats:
    """Serve one accepted websocket until either side closes; closes both. ``on_input``
    sees each key and pointer message passed to the server; ``ends`` returns the reason to
    close the viewer with (1008) when it may no longer watch (its token revoked);
    ``type_key`` is awaited with the keysym of each press of a key that types a character
    off the layout, before what follows it goes on, and types it (True) instead of the VNC
    server: x11vnc maps such a key itself and presses it at once, before Chromium has
    re-read the layout, and Chromium lost such first presses now and then."""
    stats = ProxyStats()
    viewer = _ViewerStream(websocket)
    messages = ClientMessages(allow_input=allow_input, max_cut_text=max_cut_text,
                              on_input=on_input, hold_off_layout_keys=type_key is not None)
    outbox = _Outbox(max_buffer)
    close_code, reason = 1000, ""
    # Started at once: a coroutine given and never awaited (a failed handshake) would warn.
    watch: asyncio.Task[Any] = asyncio.create_task(
        ends if ends is not None else asyncio.Event().wait())

    loop = asyncio.get_running_loop()
    forwarded_at = -_BEFORE_AGENT_KEY_S

    async def forward(data: bytes) -> None:
        nonlocal forwarded_at
        if data:
            stats.to_server += len(data)
            writer.write(data)
            try:
                async with asyncio.timeout(send_timeout_s):
                    await writer.drain()
            except TimeoutError:
                raise InputNotTaken(f"the session took none of the viewer's input for "
                                    f"{send_timeout_s:g} s") from None
            forwarded_at = loop.time()

    async def upstream() -> None:
        while True:
            await forward(messages.feed(await viewer.chunk()))
            while type_key is not None and (keysym := messages.held_key) is not None:
                typed = False
                # The keys and clicks passed to x11vnc just before are pressed in its next
                # turn: the agent's key comes after them (and what follows, after it).
                await asyncio.sleep(max(0.0, forwarded_at + _BEFORE_AGENT_KEY_S - loop.time()))
                try:
                    typed = await type_key(keysym)
                except DeskboxError as error:  # the press goes to x11vnc, as it always did
                    log.info("vnc viewer's key %#x not typed by the agent: %s", keysym,
                             error.message)
                if typed:
                    messages.typed_elsewhere()
                else:
                    messages.let_through()
                await forward(messages.feed(b""))

    async def downstream() -> None:
        while chunk := await reader.read(_CHUNK):
            stats.to_viewer += len(chunk)
            outbox.put(chunk)
        outbox.end()

    async def deliver() -> None:
        while (chunk := await outbox.get()) is not None:
            try:
                async with asyncio.timeout(send_timeout_s):
                    await websocket.send_bytes(chunk)
            except TimeoutError:
                raise ViewerTooSlow(f"the viewer took nothing for {send_timeout_s:g} s") from None

    try:
        await _handshake_viewer(websocket, viewer)
        writer.write(b"\x01")  # ClientInit, shared
        up = asyncio.create_task(upstream())
        down = asyncio.create_task(downstream())
        out = asyncio.create_task(deliver())
        try:
            running: set[asyncio.Task[Any]] = {up, down, out, watch}
            while running:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                if watch in done:
                    close_code, reason = _CLOSE_POLICY, str(watch.result())
                    break
                # The server's end of stream is final once the viewer has had what came before.
                if done != {down} or down.exception() is not None:
                    break
        finally:
            for task in (up, down, out, watch):
                task.cancel()
            await asyncio.gather(up, down, out, watch, return_exceptions=True)
        for task in (up, down, out):
            error = None if task.cancelled() else task.exception()
            if isinstance(error, RfbError | ViewerTooSlow | InputNotTaken):
                raise error
        if not out.cancelled() and out.exception() is None:
            close_code, reason = _CLOSE_SERVER_GONE, _SERVER_GONE
    except RfbError as error:
        log.info("vnc viewer closed: %s", error)
        close_code, reason = _CLOSE_POLICY, f"refused: {error}"[:120]
    except ViewerTooSlow as error:
        log.info("vnc viewer dropped: %s", error)
        stats.too_slow = True
        close_code, reason = CLOSE_TOO_SLOW, "the viewer fell behind the session's screen"
    except InputNotTaken as error:
        log.info("vnc viewer dropped: %s", error)
        close_code, reason = _CLOSE_POLICY, "the session takes no input (it is paused)"
    except (WebSocketDisconnect, ConnectionError, TimeoutError):
        pass
    finally:
        watch.cancel()
        stats.messages = messages.forwarded
        stats.dropped = sum(messages.dropped.values())
        if releases := messages.releases():
            with contextlib.suppress(Exception):
                writer.write(releases)
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await writer.drain()
                # x11vnc queues pointer events for its next turn, and the hub stops it when
                # its last viewer leaves: give it the time to apply them first.
                await asyncio.sleep(_RELEASE_SETTLE_S)
        writer.close()
        with contextlib.suppress(Exception):
            # A close waits until what the viewer sent has gone upstream: a frozen
            # session's VNC server takes nothing, and the handler waited for its resume.
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await writer.wait_closed()
        writer.transport.abort()  # nothing if it closed; else its unsent input goes
        if websocket.client_state is WebSocketState.CONNECTED:
            # A stalled viewer cannot take the close frame either: give up after a moment.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await websocket.close(code=close_code, reason=reason)
    return stats
