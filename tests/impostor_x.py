"""An impostor X server, as in issue 13: it relays to the real one, and injects.

It binds a display of its own (reserved like a session's) and relays every connection to a
real X server, passing file descriptors from the client (MIT-SHM) as they come. Told to,
it stops relaying a connection at the next message boundary and sends its own bytes
instead: a header announcing 300 MiB and then the filler it announced (as the attack did),
a flood of events, or the next genuine reply with its length inflated.
"""

from __future__ import annotations

import array
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from deskbox_server.backends.displays import DisplayReservation

MIB = 1 << 20
_FILLER = bytes(MIB)


def generic_event(size: int) -> bytes:
    """A GenericEvent header announcing ``size`` bytes in all."""
    return struct.pack("=BBHIH22x", 35, 0, 0, (size - 32) // 4, 0)


def events(count: int, code: int = 64) -> bytes:
    """``count`` plain 32-byte events of a type nobody selected."""
    return struct.pack("=BB30x", code, 0) * count


class _Link:
    """One client connection: relayed both ways until told to attack."""

    def __init__(self, client: socket.socket, real_path: str, inflate: int | None) -> None:
        self.client = client
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.connect(real_path)
        self._lock = threading.Lock()
        self._head = bytearray()
        self._left = 0
        self._set_up = False
        self._attack: tuple[bytes, int] | None = None  # (bytes, filler) at the next boundary
        self._inflate = inflate
        self.attacked = threading.Event()
        relays = (threading.Thread(target=self._upstream, daemon=True),
                  threading.Thread(target=self._downstream, daemon=True))
        # A relay may start an attack (appending its sender here) before both have started.
        self.threads = list(relays)
        for thread in relays:
            thread.start()

    def attack(self, payload: bytes, filler: int = 0) -> None:
        with self._lock:
            self._attack = (payload, filler)
            if self._left == 0 and not self._head:
                self._start_attack()

    def inflate_next_reply(self, size: int) -> None:
        with self._lock:
            self._inflate = size

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join(timeout=5)
        self.client.close()
        self.server.close()

    def _upstream(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                data, ancillary, _, _ = self.client.recvmsg(65536, socket.CMSG_SPACE(64))
                if not data:
                    return
                fds = array.array("i")
                for _, _, payload in ancillary:
                    fds.frombytes(payload)
                self.server.sendmsg(
                    [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)] if fds else []
                )
                for fd in fds:
                    socket.close(fd)

    def _downstream(self) -> None:
        with contextlib.suppress(OSError):
            while not self.attacked.is_set():
                data = self.server.recv(65536)
                if not data:
                    return
                with self._lock:
                    self._relay(data)

    def _relay(self, data: bytes) -> None:
        i = 0
        while i < len(data) and not self.attacked.is_set():
            if self._left:
                take = min(self._left, len(data) - i)
                self.client.sendall(data[i : i + take])
                i += take
                self._left -= take
            else:
                size = 32 if self._set_up else 8
                take = min(size - len(self._head), len(data) - i)
                self._head += data[i : i + take]
                i += take
                if len(self._head) < size:
                    continue
                head = bytes(self._head)
                self._head.clear()
                self._left = self._length(head)
                if self._set_up and head[0] == 1 and self._inflate is not None:
                    head = head[:4] + struct.pack("=I", (self._inflate - 32) // 4) + head[8:]
                    self._attack = (head, self._inflate - 32)
                    self._start_attack()
                    return
                self._set_up = True
                self.client.sendall(head)
            if self._left == 0 and self._attack is not None:
                self._start_attack()

    def _length(self, head: bytes) -> int:
        if not self._set_up:
            return int(struct.unpack_from("=H", head, 6)[0]) * 4
        if head[0] == 1 or head[0] & 0x7F == 35:
            return int(struct.unpack_from("=I", head, 4)[0]) * 4
        return 0

    def _start_attack(self) -> None:
        assert self._attack is not None
        payload, filler = self._attack
        self.attacked.set()
        thread = threading.Thread(target=self._send, args=(payload, filler), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _send(self, payload: bytes, filler: int) -> None:
        with contextlib.suppress(OSError):
            self.client.sendall(payload)
            while filler > 0:
                self.client.sendall(_FILLER[: min(filler, MIB)])
                filler -= MIB


class Impostor:
    """A listening socket at ``listen_at``; every connection is relayed to ``real_path``."""

    def __init__(self, real_path: str, listen_at: Path) -> None:
        self._real_path = real_path
        self.path = listen_at
        self.name = ""  # the display leading here, once published
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(listen_at))
        self._listener.listen(16)
        self.links: list[_Link] = []
        self._inflate: int | None = None
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                self.links.append(_Link(client, self._real_path, self._inflate))

    def attack(self, payload: bytes, filler: int = 0) -> None:
        """Every connection made so far gets ``payload`` (and ``filler`` bytes) next."""
        for link in self.links:
            link.attack(payload, filler)

    def inflate_next_reply(self, size: int) -> None:
        """Every connection, made so far or later, gets its next reply announced as ``size``."""
        self._inflate = size
        for link in self.links:
            link.inflate_next_reply(size)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._accepting.join(timeout=5)
        for link in self.links:
            link.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@contextlib.contextmanager
def impostor(real_display: str, private_dir: Path) -> Iterator[Impostor]:
    """An impostor on a display of its own (reserved like a session's) for ``real_display``."""
    reservation = DisplayReservation.allocate(private_dir, 700, 800)
    fake = Impostor(f"/tmp/.X11-unix/X{real_display.lstrip(':')}", private_dir / "impostor")
    try:
        reservation.publish(fake.path)
        fake.name = reservation.name
        yield fake
    finally:
        fake.close()
        reservation.release()
