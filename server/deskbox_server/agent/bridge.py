"""A real socket whose far end is an agent channel, for code that wants a socket.

The VNC proxy (vnc/proxy.py) takes asyncio streams, and the DevTools code (devtools.py:
``get_json``, websockets' ``connect(sock=)``) a socket; an agent channel
(:class:`~deskbox_server.agent.Channel`) is neither. :func:`bridge` makes a unix
socketpair, gives one end to the caller and relays the other end to the channel in a task
of its own, both ways, with half-closes passed on.

Nothing here buffers without limit: each direction holds at most one read (``CHUNK``)
besides the socketpair's kernel buffers. A caller that stops reading stops the relay,
which stops reading the channel, which keeps the channel's HTTP/2 window from being
handed back: the agent stops sending at the stream window (1 MiB, PROTOCOL.md) and stops
reading the socket inside the sandbox. The other way, :meth:`Channel.write` waits for the
agent's window, so a socket in the sandbox that reads nothing stops the caller's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from . import Channel

__all__ = ["CHUNK", "LINGER_S", "Bridge", "Bridges", "bridge"]

log = logging.getLogger("deskbox.agent")

CHUNK = 64 * 1024
# Once the caller closed its end, the far side gets this long to finish what it sends
# (it goes nowhere); then the channel is reset. A caller that only half-closed and wants
# the rest must read it within this time.
LINGER_S = 5.0


class Bridge:
    """The relay between our end of the socketpair and one channel."""

    def __init__(self, channel: Channel, ours: socket.socket) -> None:
        self.channel = channel
        self._ours = ours
        self.ended: str | None = None  # why the relay ended, once it did
        self.task = asyncio.create_task(self._run(), name=f"bridge {channel.name}")
        # A relay cancelled before it first ran never reaches its finally (a session let go
        # of its agent just after opening a bridge): the socket and channel close here too.
        self.task.add_done_callback(lambda _: self._release())

    def _release(self) -> None:
        self.channel.close()
        self._ours.close()

    def close(self) -> None:
        """End the relay now: the caller's socket reads EOF, the channel is reset."""
        self.task.cancel()

    async def wait(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def _up(self, loop: asyncio.AbstractEventLoop) -> None:  # caller -> sandbox
        while chunk := await loop.sock_recv(self._ours, CHUNK):
            await self.channel.write(chunk)
        await self.channel.write_eof()

    async def _down(self, loop: asyncio.AbstractEventLoop) -> None:  # sandbox -> caller
        while chunk := await self.channel.read(CHUNK):
            await loop.sock_sendall(self._ours, chunk)
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_WR)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        up = asyncio.create_task(self._up(loop))
        down = asyncio.create_task(self._down(loop))
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            if up.done() and not up.exception() and not down.done():
                await asyncio.wait({down}, timeout=LINGER_S)
            elif down.done() and not down.exception() and not up.done():
                await up  # the caller saw EOF; it closes when it is done writing
            self.ended = "closed"
            for task in (up, down):
                if task.done() and (error := task.exception()) is not None:
                    self.ended = f"{type(error).__name__}: {error}"
                    log.debug("channel %s: %s", self.channel.name, self.ended)
        except asyncio.CancelledError:
            self.ended = "closed by the host"
            raise
        except Exception as error:  # the channel or the socket broke: the relay ends
            self.ended = f"{type(error).__name__}: {error}"
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            self._release()


class Bridges:
    """The live bridges of one owner (a session's VNC server, its DevTools), to end them
    together; each leaves the set when its relay ends."""

    def __init__(self) -> None:
        self._live: set[Bridge] = set()

    def __len__(self) -> int:
        return len(self._live)

    def add(self, channel: Channel) -> socket.socket:
        theirs, item = bridge(channel)
        self._live.add(item)
        item.task.add_done_callback(lambda _: self._live.discard(item))
        return theirs

    async def close(self) -> None:
        live = list(self._live)
        for item in live:
            item.close()
        for item in live:
            await item.wait()


def bridge(channel: Channel) -> tuple[socket.socket, Bridge]:
    """The caller's end (non-blocking) of a socketpair relayed to ``channel``.

    The bridge owns the channel from now on; closing the returned socket ends both.
    """
    theirs, ours = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        theirs.setblocking(False)
        ours.setblocking(False)
        return theirs, Bridge(channel, ours)
    except BaseException:
        theirs.close()
        ours.close()
        channel.close()
        raise
