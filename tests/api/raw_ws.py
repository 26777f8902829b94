"""A websocket client on a bare socket, for clients that misbehave on purpose.

Client libraries read from the socket in the background (websockets' sync client keeps
reading into its queue, answers pings): a client that never reads cannot be made with them.
This one reads only when asked to, with a small receive buffer, so the server sees a client
that has stopped reading after a few kilobytes.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
import time
from urllib.parse import urlsplit

__all__ = ["Closed", "RawWebSocket"]

_TEXT, _BINARY, _CLOSE = 0x1, 0x2, 0x8


class Closed(Exception):
    """The server ended the connection: ``code`` from its close frame, or None (no frame)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"closed: {code} {reason}")
        self.code = code
        self.reason = reason


class RawWebSocket:
    def __init__(
        self,
        url: str,
        headers: dict[str, str] | None = None,
        subprotocol: str | None = None,
        receive_buffer: int = 4096,
        timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Set before connecting: the window the server sees is then this small.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout_s)
        self._buffer = bytearray()
        try:
            self.sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
            self._handshake(parts, headers or {}, subprotocol)
        except BaseException:
            self.sock.close()
            raise

    def _handshake(self, parts: object, headers: dict[str, str], subprotocol: str | None) -> None:
        assert hasattr(parts, "path") and hasattr(parts, "netloc") and hasattr(parts, "query")
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        if subprotocol:
            lines.append(f"Sec-WebSocket-Protocol: {subprotocol}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while b"\r\n\r\n" not in self._buffer:
            self._fill()
        head, _, rest = bytes(self._buffer).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(f"the upgrade was refused: {status.decode(errors='replace')}")
        self._buffer = bytearray(rest)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise Closed(None)
        self._buffer += data

    def _take(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    # -- sending --------------------------------------------------------------------------

    def _frame(self, opcode: int, payload: bytes) -> bytes:
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            head = struct.pack(">BB", 0x80 | opcode, 0x80 | length)
        elif length < 1 << 16:
            head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return head + mask + masked

    def send_text(self, text: str) -> None:
        self.sock.sendall(self._frame(_TEXT, text.encode()))

    def send_binary(self, data: bytes) -> None:
        self.sock.sendall(self._frame(_BINARY, data))

    def try_send_text(self, text: str, timeout_s: float) -> bool:
        """Send unless the server has stopped reading for ``timeout_s``: False then.

        A partial frame may stay behind; use this only to find where the server stops.
        """
        self.sock.settimeout(timeout_s)
        try:
            self.sock.sendall(self._frame(_TEXT, text.encode()))
            return True
        except TimeoutError:
            return False

    # -- receiving ------------------------------------------------------------------------

    def recv(self, timeout_s: float = 10.0) -> str | bytes:
        """The next data message; raises Closed at a close frame or the end of the stream."""
        self.sock.settimeout(timeout_s)
        while True:
            first, second = self._take(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack(">H", self._take(2))
            elif length == 127:
                (length,) = struct.unpack(">Q", self._take(8))
            payload = self._take(length)
            if opcode == _CLOSE:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                raise Closed(code, payload[2:].decode(errors="replace"))
            if opcode == _TEXT:
                return payload.decode()
            if opcode == _BINARY:
                return payload
            # ping/pong: ignored (an unanswered ping is part of misbehaving)

    def drain(self, timeout_s: float) -> tuple[list[str | bytes], Closed | None]:
        """Every message until the connection ends or ``timeout_s`` passes."""
        messages: list[str | bytes] = []
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                messages.append(self.recv(timeout_s=left))
            except Closed as closed:
                return messages, closed
            except ConnectionResetError:
                # Closing with requests unread in its socket, the server's kernel resets.
                return messages, Closed(None, "reset")
            except TimeoutError:
                break
        return messages, None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawWebSocket:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
