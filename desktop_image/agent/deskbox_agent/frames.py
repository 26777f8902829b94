"""A guard in front of h2 (the same as the host's, server/deskbox_server/agent/frames.py).

h2 buffers a frame whole before it looks at its length, so a header announcing 16 MiB
would make it hold 16 MiB. This scanner sees every 9-byte frame header as it arrives and
refuses, before any of the payload is kept: a peer that does not start with the client
preface and SETTINGS, a frame over our MAX_FRAME_SIZE, and a header block (HEADERS +
CONTINUATIONs) over its cap or interleaved with other frames. The host is trusted, but
any process of the sandbox can connect to the agent's socket as well.
"""

from __future__ import annotations

__all__ = ["FrameGuard", "FrameViolation"]

_DATA, _HEADERS, _SETTINGS, _PUSH_PROMISE, _CONTINUATION = 0, 1, 4, 5, 9
_END_HEADERS, _ACK = 0x4, 0x1
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class FrameViolation(Exception):
    """The bytes are not acceptable HTTP/2 from an agent; the message says why."""


class FrameGuard:
    def __init__(self, max_frame_size: int, max_header_block: int) -> None:
        self._preface = len(PREFACE)  # bytes of the client preface still to check
        self._max_frame = max_frame_size
        self._max_block = max_header_block
        self._head = bytearray()
        self._left = 0  # payload bytes of the current frame still to come
        self._block: int | None = None  # bytes of the header block in progress
        self._first = True
        self.frames = 0  # complete frame headers seen so far
        self.empty_data = 0  # DATA frames without payload

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        if self._preface:
            take = min(self._preface, n)
            start = len(PREFACE) - self._preface
            if data[:take] != PREFACE[start : start + take]:
                raise FrameViolation(f"not the HTTP/2 client preface: {data[:24]!r}")
            self._preface -= take
            i = take
        while i < n:
            if self._left:
                take = min(self._left, n - i)
                self._left -= take
                i += take
                continue
            need = 9 - len(self._head)
            self._head += data[i : i + need]
            i += need
            if len(self._head) < 9:
                return
            self._check(bytes(self._head))
            self._head.clear()

    def _check(self, head: bytes) -> None:
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        if self._first:
            self._first = False
            if kind != _SETTINGS or flags & _ACK or length % 6:
                raise FrameViolation(
                    f"the first frame is not SETTINGS (first bytes {head!r})"
                )
        if length > self._max_frame:
            raise FrameViolation(
                f"a frame of type {kind} announces {length} bytes, over the "
                f"{self._max_frame} allowed"
            )
        if self._block is not None:
            if kind != _CONTINUATION:
                raise FrameViolation("a frame of another type inside a header block")
            self._block += length
        elif kind == _CONTINUATION:
            raise FrameViolation("CONTINUATION without HEADERS")
        elif kind in (_HEADERS, _PUSH_PROMISE) and not flags & _END_HEADERS:
            self._block = length
        if self._block is not None:
            if self._block > self._max_block:
                raise FrameViolation(f"a header block over {self._max_block} bytes")
            if flags & _END_HEADERS:
                self._block = None
        if kind == _DATA and length == 0:
            self.empty_data += 1
        self.frames += 1
        self._left = length
