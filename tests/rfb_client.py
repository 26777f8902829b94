"""A small RFB viewer over the websocket proxy, for tests and the benchmark.

It speaks the client side of RFB 3.8 (security None), asks for raw 32-bit pixels and keeps
a framebuffer, and can send any message, including the input a read-only viewer must not
get through. ``unix:/path`` instead of a websocket URL speaks RFB straight to a server's unix
socket (bench/vnc.py compares VNC servers without the proxy).
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

import numpy as np
from websockets.sync.client import ClientConnection, connect

__all__ = ["RfbViewer", "UnixLink"]

_PIXEL_FORMAT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)


class UnixLink:
    """A unix stream socket with the websocket connection's send/recv/close."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        try:
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> bytes:
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the VNC server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


class RfbViewer:
    def __init__(self, url: str, timeout_s: float = 20.0, **connect_args: Any) -> None:
        self.ws: ClientConnection | UnixLink
        if url.startswith("unix:"):
            self.ws = UnixLink(url.removeprefix("unix:"), timeout_s)
        else:
            self.ws = connect(
                url, subprotocols=["binary"], compression=None, open_timeout=timeout_s,  # type: ignore[list-item]
                max_size=None, **connect_args,
            ).__enter__()
        self.timeout_s = timeout_s
        self._buffer = bytearray()
        self.cut_text: list[bytes] = []
        self.updates = 0
        try:
            self._handshake()
        except BaseException:
            self.ws.close()
            raise

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> RfbViewer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read(self, size: int) -> bytes:
        deadline = time.monotonic() + self.timeout_s
        while len(self._buffer) < size:
            data = self.ws.recv(timeout=max(0.01, deadline - time.monotonic()))
            assert isinstance(data, bytes), "the server sent a text message"
            self._buffer += data
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def _handshake(self) -> None:
        assert self._read(12) == b"RFB 003.008\n"
        self.ws.send(b"RFB 003.008\n")
        count = self._read(1)[0]
        types = self._read(count)
        assert 1 in types, types
        self.ws.send(b"\x01")
        assert struct.unpack(">I", self._read(4))[0] == 0
        self.ws.send(b"\x01")  # shared
        self.width, self.height = struct.unpack(">HH", self._read(4))
        self._read(16)  # the server's pixel format
        (name_length,) = struct.unpack(">I", self._read(4))
        self.name = self._read(name_length)
        self.ws.send(b"\x00\x00\x00\x00" + _PIXEL_FORMAT)
        self.ws.send(struct.pack(">BxHi", 2, 1, 0))  # SetEncodings: Raw only
        self.frame = np.zeros((self.height, self.width, 4), dtype=np.uint8)

    # -- sending --------------------------------------------------------------------------

    def request(self, incremental: bool = False) -> None:
        self.ws.send(struct.pack(">BBHHHH", 3, int(incremental), 0, 0, self.width, self.height))

    def pointer(self, x: int, y: int, buttons: int) -> None:
        self.ws.send(struct.pack(">BBHH", 5, buttons, x, y))

    def click(self, x: int, y: int) -> None:
        self.pointer(x, y, 0)
        self.pointer(x, y, 1)
        self.pointer(x, y, 0)

    def key(self, keysym: int, down: bool) -> None:
        self.ws.send(struct.pack(">BBxxI", 4, int(down), keysym))

    def cut_text_to_server(self, text: bytes) -> None:
        self.ws.send(struct.pack(">BxxxI", 6, len(text)) + text)

    def send_raw(self, data: bytes) -> None:
        self.ws.send(data)

    # -- receiving ------------------------------------------------------------------------

    def read_message(self) -> int:
        """Read one server message (framebuffer updates go into ``frame``); its type."""
        kind = self._read(1)[0]
        if kind == 0:
            _, rects = struct.unpack(">BH", self._read(3))
            for _ in range(rects):
                x, y, w, h, encoding = struct.unpack(">HHHHi", self._read(12))
                assert encoding == 0, f"unexpected encoding {encoding}"
                pixels = np.frombuffer(self._read(w * h * 4), dtype=np.uint8)
                self.frame[y : y + h, x : x + w] = pixels.reshape(h, w, 4)
            self.updates += 1
        elif kind == 1:
            _, _, count = struct.unpack(">BHH", self._read(5))
            self._read(6 * count)
        elif kind == 2:
            pass
        elif kind == 3:
            (length,) = struct.unpack(">3xI", self._read(7))
            self.cut_text.append(self._read(length))
        else:
            raise AssertionError(f"unknown server message type {kind}")
        return kind

    def full_frame(self) -> np.ndarray:
        """A whole, non-incremental framebuffer update: the screen as RGB (h, w, 3)."""
        self.request(incremental=False)
        while self.read_message() != 0:
            pass
        return self.rgb()

    def rgb(self) -> np.ndarray:
        return self.frame[:, :, 2::-1].copy()  # BGRX little-endian → RGB

    def wait_cut_text(self, timeout_s: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        while not self.cut_text:
            assert time.monotonic() < deadline, "no ServerCutText arrived"
            self.request(incremental=True)
            self.read_message()
        return self.cut_text.pop(0)
