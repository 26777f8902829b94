"""Relaying one DevTools websocket, with what it holds for a slow client bounded.

The browser is the sandbox's, so hostile: it may send as fast as it can, to clients that
read nothing. Its messages are read at once into the client's outbox (never left to pile
up in a library's queue we cannot see), each at most ``cdp_max_message_bytes`` (the
websocket closes with 1009 beyond). A message counts against its client until the client
has taken it: until it has left the connection's write buffer (abort.py), else until the
next one could be written after it, or the relay has ended. Then:

- a client more than ``cdp_client_buffer_bytes`` behind (one message may always wait),
  or that takes nothing for ``ws_send_timeout_s``, is dropped;
- one session's clients are at most ``cdp_session_buffer_bytes`` behind together: over
  it, the client furthest behind is dropped.

A dropped client gets a close frame (1008); unless it has read up to it and answered
within a second, its connection is aborted, so what it left unread is freed too. Besides
the session's budget, each connection holds at most the message the library is reading
from the browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from .abort import abort_connection, unsent_bytes

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_TOO_BIG",
    "CLOSE_TOO_SLOW",
    "ClientTooSlow",
    "Outbox",
    "RelayLimits",
    "SessionBuffers",
    "relay",
]

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_SLOW = CLOSE_POLICY
CLOSE_TOO_BIG = 1009
CLOSE_UNSUPPORTED = 1003
_CLOSE_TIMEOUT_S = 1.0  # a stalled client cannot take the close frame either
_DELIVER_AFTER_CLOSE_S = 2.0
_TOUCH_EVERY_S = 1.0
# A close reason has at most 123 bytes.
_BROWSER_CLOSED = (
    "the browser closed this DevTools connection (target closed, browser restarting or "
    "session ended)"
)
_TOO_SLOW = "the DevTools client fell behind the browser's messages"

Message = str | bytes


class ClientTooSlow(Exception):
    """The client took too little of what the browser sent it."""


class RelayLimits:
    def __init__(self, max_message: int, client_buffer: int, send_timeout_s: float) -> None:
        self.max_message = max_message
        self.client_buffer = client_buffer
        self.send_timeout_s = send_timeout_s


class SessionBuffers:
    """How far behind the browser all DevTools clients of one session are, in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.outboxes: set[Outbox] = set()

    def charge(self, outbox: Outbox, size: int) -> None:
        """Count ``size`` more bytes for ``outbox``, dropping the client furthest behind
        while they do not fit; ClientTooSlow when that client is ``outbox``'s own."""
        if self.used + size > self.limit:
            # A client that has taken what it was written is behind in nothing: a client
            # that read every answer was dropped as "behind" when its last one stayed
            # counted (two clients' large screenshots put a third over the budget).
            for box in self.outboxes:
                box.settle()
        while self.used + size > self.limit:
            # A dropped client's bytes are counted until its relay has ended. A client
            # with messages not yet written is behind for sure; one whose last message may
            # still wait in its write buffer only perhaps, so it goes last.
            candidates = [box for box in self.outboxes if box.waiting and not box.failed.done()]
            behind = max(candidates, key=lambda box: (box.pending > 0, box.waiting),
                         default=None)
            if behind is None or behind is outbox:
                raise ClientTooSlow(
                    f"this session's DevTools clients are more than {self.limit} bytes behind"
                )
            behind.fail(f"this session's DevTools clients are more than {self.limit} bytes "
                        "behind, this one the most")
        self.used += size


class Outbox:
    """Messages from the browser for one client; ``waiting``: bytes it has not taken."""

    def __init__(
        self, session: SessionBuffers, limit: int, unsent: Callable[[], int] | None = None
    ) -> None:
        self._session = session
        self._limit = limit
        self._unsent = unsent  # the bytes in the connection's write buffer, if known
        self._messages: deque[Message] = deque()
        self._ready = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._written = 0  # the last message written, maybe not yet taken by the client
        self.failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiting = 0
        session.outboxes.add(self)

    @property
    def pending(self) -> int:
        """Bytes of messages not yet written to the client."""
        return self.waiting - self._written

    def put(self, message: Message) -> None:
        if self.failed.done():
            raise ClientTooSlow(self.failed.result())
        size = len(message)
        # The last message written is left out: a client that is keeping up has taken it.
        pending = self.pending
        if pending and pending + size > self._limit:
            raise ClientTooSlow(f"the client is more than {self._limit} bytes behind")
        self._session.charge(self, size)
        self.waiting += size
        self._messages.append(message)
        self._ready.set()
        self._empty.clear()

    async def get(self) -> Message:
        """The oldest message (it stays counted until the next one is written)."""
        while not self._messages:
            self._ready.clear()
            await self._ready.wait()
        return self._messages.popleft()

    def written(self, message: Message) -> None:
        """``message`` was written: the client has taken the one before it."""
        self._credit(self._written)
        self._written = len(message)
        if not self._messages:
            self._empty.set()

    def settle(self) -> None:
        """Give back what of the last message written has left the write buffer."""
        if self._written and self._unsent is not None:
            still = min(self._written, self._unsent())
            self._credit(self._written - still)
            self._written = still

    async def delivered(self) -> None:
        """Until every message put so far has been written."""
        await self._empty.wait()

    def fail(self, reason: str) -> None:
        """Drop this client (its relay ends) and free what waits for it."""
        if not self.failed.done():
            self.failed.set_result(reason)
        self._credit(sum(len(message) for message in self._messages))
        self._messages.clear()

    def close(self) -> None:
        """Give back everything still counted (the relay has ended)."""
        self._messages.clear()
        self._credit(self.waiting)
        self._written = 0
        self._session.outboxes.discard(self)

    def _credit(self, size: int) -> None:
        self.waiting -= size
        self._session.used -= size


async def relay(
    websocket: WebSocket,
    upstream: ClientConnection,
    session: SessionBuffers,
    limits: RelayLimits,
    touch: Callable[[], None],
    dropped: Callable[[str], None],
    ends: Coroutine[Any, Any, str] | None = None,
) -> None:
    """Both directions until either side closes or the client falls behind; the client is
    then closed with a code and a reason. ``touch`` notes use; ``dropped`` a slow client;
    ``ends`` returns the reason to close the client with (1008) when it may no longer use
    the browser (its token revoked)."""
    outbox = Outbox(session, limits.client_buffer, unsent_bytes(websocket))
    touched = 0.0
    # Started at once, as the others: a coroutine never awaited would warn.
    ending: asyncio.Task[Any] = asyncio.create_task(
        ends if ends is not None else asyncio.Event().wait())

    async def from_client() -> tuple[int, str] | None:
        nonlocal touched
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            data: str | None = message.get("text")
            if data is None:
                # Chromium's DevTools hangs up on a binary frame, and the client was told
                # the browser had closed.
                return CLOSE_UNSUPPORTED, "DevTools messages are JSON text; a binary frame " \
                    "is refused"
            if len(data) > limits.max_message:
                return CLOSE_TOO_BIG, (
                    f"a DevTools message may be at most {limits.max_message} bytes"
                )
            await upstream.send(data)
            now = time.monotonic()
            if now - touched > _TOUCH_EVERY_S:  # CDP use keeps the session from expiring
                touched = now
                touch()

    async def from_browser() -> tuple[int, str]:
        try:
            async for data in upstream:
                outbox.put(data)
        except ConnectionClosed as closed:
            if closed.sent is not None and closed.sent.code == CLOSE_TOO_BIG:
                return CLOSE_TOO_BIG, (
                    f"the browser sent a message larger than {limits.max_message} bytes"
                )
        # What the browser sent before it closed, if the client takes it soon: a
        # checkpoint waits for this relay to end.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DELIVER_AFTER_CLOSE_S):
                await outbox.delivered()
        return CLOSE_GOING_AWAY, _BROWSER_CLOSED

    async def to_client() -> None:
        while True:
            data = await outbox.get()
            try:
                async with asyncio.timeout(limits.send_timeout_s):
                    if isinstance(data, str):
                        await websocket.send_text(data)
                    else:
                        await websocket.send_bytes(data)
            except TimeoutError:
                raise ClientTooSlow(
                    f"the client took nothing for {limits.send_timeout_s:g} s"
                ) from None
            outbox.written(data)

    tasks: list[asyncio.Future[Any]] = [
        asyncio.create_task(from_client()), asyncio.create_task(from_browser()),
        asyncio.create_task(to_client()),
    ]
    try:
        watched: list[asyncio.Future[Any]] = [*tasks, outbox.failed, ending]
        done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*tasks, ending):
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(ending, return_exceptions=True)
        outbox.close()
    slow = [str(result) for result in results if isinstance(result, ClientTooSlow)]
    if outbox.failed in done:
        slow.append(outbox.failed.result())
    close: tuple[int, str] | None = None
    if slow:
        dropped(slow[0])
        close = CLOSE_TOO_SLOW, _TOO_SLOW
    elif ending in done and not ending.cancelled() and ending.exception() is None:
        close = CLOSE_POLICY, str(ending.result())
    else:
        for task, result in zip(tasks, results, strict=True):
            if task in done and isinstance(result, tuple):
                close = result
    if close is None:
        return
    try:
        async with asyncio.timeout(_CLOSE_TIMEOUT_S):
            await websocket.close(close[0], close[1][:120])
            if slow:  # closed once it has read everything before the close frame
                while (await websocket.receive())["type"] != "websocket.disconnect":
                    pass
    except TimeoutError:
        # The server would keep what the client left unread until it reads it, which
        # may be never: free it now.
        abort_connection(websocket)
    except (RuntimeError, WebSocketDisconnect, OSError):
        pass
