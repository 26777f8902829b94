"""The capture connection's path to a sandbox's X server, checked on the way.

libxcb allocates whatever length a reply claims and queues every event it is sent, with no
way to bound either. So the capture connection's libxcb talks to one end of a socketpair
(``xcb_connect_to_fd``), and a small thread relays between the other end and the X socket:

- from libxcb to the X server: bytes as they are, and the file descriptors passed with them
  (MIT-SHM's ShmAttachFd);
- from the X server: only framing is read (the setup reply, then 32-byte errors, replies
  and events, with a reply's or GenericEvent's length from its header). A reply over the
  limit, more replies and errors than requests could have caused (at most one per 4 bytes
  sent), or events over the budget end the relay, and ``failure`` says why. Events are not
  passed on: nothing reads them on this connection, and libxcb would keep them forever.
  File descriptors from the server are never accepted (plain ``recv`` drops them).

Closing both ends makes libxcb's next call fail at once; the caller reports ``failure``.
"""

from __future__ import annotations

import array
import contextlib
import os
import re
import select
import socket
import struct
import threading

from ..errors import DesktopFailed
from .xlimits import EventBudget, flood, oversize

__all__ = ["XRelay", "x_socket_path"]

_CHUNK = 256 * 1024
_MAX_FDS = 16  # libxcb passes at most 16 with one write
_ERROR, _REPLY, _GENERIC_EVENT = 0, 1, 35


def x_socket_path(display_name: str) -> str:
    """The unix socket of display ``:N`` (what python-xlib and libxcb connect to)."""
    match = re.fullmatch(r"(?:unix)?:(\d+)(?:\.\d+)?", display_name)
    if match is None:
        raise DesktopFailed(f"not a local X display: {display_name!r}")
    return f"/tmp/.X11-unix/X{match.group(1)}"


class _Breach(Exception):
    pass


class _ServerFraming:
    """Splits what the X server sends into messages; returns what libxcb may see."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._head = bytearray()
        self._left = 0  # bytes of the current message still to come
        self._forward = True
        self._set_up = False
        self._budget = EventBudget()
        self.responses = 0
        self.sent = 0  # bytes libxcb has sent: every request is at least 4

    def feed(self, data: memoryview) -> bytes | memoryview:
        """What of ``data`` libxcb may see: often ``data`` itself, valid until the next read."""
        parts: list[bytes | memoryview] = []
        i, n = 0, len(data)
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                if self._forward:
                    parts.append(data[i : i + take])
                i += take
                self._left -= take
                continue
            size = 32 if self._set_up else 8
            take = min(size - len(self._head), n - i)
            self._head += data[i : i + take]
            i += take
            if len(self._head) == size:
                self._start(bytes(self._head))
                if self._forward:
                    parts.append(bytes(self._head))
                self._head.clear()
        # An image's body comes in whole chunks: passed on without a copy.
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _start(self, head: bytes) -> None:
        if not self._set_up:  # at most 8 + 65535 * 4 bytes
            self._set_up = True
            self._forward = True
            self._left = struct.unpack_from("=H", head, 6)[0] * 4
            return
        kind = head[0] & 0x7F
        length = 0
        if head[0] == _REPLY or kind == _GENERIC_EVENT:
            length = struct.unpack_from("=I", head, 4)[0] * 4
            if 32 + length > self._limit:
                what = "reply" if head[0] == _REPLY else "event"
                raise _Breach(oversize(what, 32 + length, self._limit))
        self._left = length
        self._forward = head[0] in (_ERROR, _REPLY)
        if self._forward:
            self.responses += 1
            if self.responses > self.sent // 4:
                raise _Breach("the X server sent replies to requests never made")
        elif not self._budget.spend(1):
            raise _Breach(flood())


class XRelay:
    """Relays one libxcb connection (``client_fd``) to the X server of ``display_name``."""

    def __init__(self, display_name: str, limit: int) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._server.connect(x_socket_path(display_name))
        except OSError as error:
            self._server.close()
            raise DesktopFailed(f"cannot connect to X display {display_name}: {error}") from None
        self._client, self._inner = socket.socketpair(
            socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC
        )
        self._server.setblocking(False)
        self._inner.setblocking(False)
        self._framing = _ServerFraming(limit)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.failure: str | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"xrelay-{display_name}", daemon=True
        )
        self._thread.start()

    def client_fd(self) -> int:
        """libxcb's end; it becomes libxcb's (xcb_disconnect closes it)."""
        return self._client.detach()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"q")
        self._thread.join(timeout=2)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._client.close()

    def _run(self) -> None:
        try:
            self._relay()
        except _Breach as breach:
            self.failure = str(breach)
        except OSError:
            pass  # either side went away
        finally:
            for sock in (self._inner, self._server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _relay(self) -> None:
        inner, server, framing = self._inner, self._server, self._framing
        inner_fd, server_fd = inner.fileno(), server.fileno()
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        to_server = b""
        fds: list[int] = []
        to_client: bytes | memoryview = b""  # a view of buffer: read again once it is sent
        try:
            while True:
                readers: list[int] = [self._wake_r]
                writers: list[int] = []
                (writers if to_server else readers).append(server_fd if to_server else inner_fd)
                (writers if to_client else readers).append(inner_fd if to_client else server_fd)
                readable, writable, _ = select.select(readers, writers, [])
                if self._wake_r in readable:
                    return
                if inner_fd in readable:
                    to_server, fds = _receive_with_fds(inner)
                    if not to_server:
                        return
                    framing.sent += len(to_server)
                if server_fd in writable:
                    ancillary = []
                    if fds:
                        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    to_server = to_server[server.sendmsg([to_server], ancillary) :]
                    _close_all(fds)
                    fds = []
                if server_fd in readable:
                    count = server.recv_into(buffer)
                    if count == 0:
                        return
                    to_client = framing.feed(view[:count])
                if inner_fd in writable:
                    to_client = to_client[inner.send(to_client) :]
        finally:
            _close_all(fds)


def _receive_with_fds(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, ancillary, _flags, _ = sock.recvmsg(_CHUNK, socket.CMSG_SPACE(_MAX_FDS * 4))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
