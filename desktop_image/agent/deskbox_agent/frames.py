"""A guard in front of h2: checks frame headers before h2 buffers a byte of the frame.

Both ends use it: the agent on what the host sends (the host is trusted, but any process
of the sandbox can connect to the agent's socket as well), the host on what the agent
sends (server/deskbox_server/agent/connection.py, which imports it from this package).

h2 buffers a frame whole before it looks at its length, so a header announcing 16 MiB
would make it hold 16 MiB. This scanner sees every 9-byte frame header as it arrives and
refuses, before any of the payload is kept: a peer that does not start with (the client
preface and) SETTINGS, a frame over our MAX_FRAME_SIZE, and a header block (HEADERS +
CONTINUATIONs) over its cap or interleaved with other frames. It also counts frames,
which the host's flood budget uses.
"""

from __future__ import annotations

__all__ = ["PREFACE", "FrameGuard", "FrameViolation"]

_DATA, _HEADERS, _SETTINGS, _PUSH_PROMISE, _CONTINUATION = 0, 1, 4, 5, 9
_END_HEADERS, _ACK = 0x4, 0x1
_CONTROL = (2, 4, 6)  # PRIORITY, SETTINGS, PING
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_LATE_STREAMS = 256  # given-up streams remembered (the agent allows 128 at once)


class FrameViolation(Exception):
    """The bytes are not acceptable HTTP/2 from an agent; the message says why."""


class FrameGuard:
    def __init__(self, max_frame_size: int, max_header_block: int, preface: bool = False) -> None:
        """``preface``: the peer is a client, whose bytes start with the client preface."""
        self._preface = len(PREFACE) if preface else 0  # bytes of it still to check
        self._max_frame = max_frame_size
        self._max_block = max_header_block
        self._head = bytearray()
        self._left = 0  # payload bytes of the current frame still to come
        self._block: int | None = None  # bytes of the header block in progress
        self._first = True
        # Complete frames seen so far: counted when the last byte of the frame arrives, as
        # h2 hands on a frame only then (counted at its header, a frame split across two
        # reads looked like junk in the first: thousands a second at full speed).
        self.frames = 0
        self._late_frame = False  # the frame in progress is late DATA (below)
        self.empty_data = 0  # DATA frames without payload
        self.control = 0  # frames that carry nothing for a stream: counted before h2 runs
        # Streams this end gave up: the bytes of DATA the peer may still have had on the
        # way (their window then); such frames are counted in ``late_data``, not as junk.
        self._late: dict[int, int] = {}
        self.late_data = 0

    def expect_late(self, stream_id: int, window: int) -> None:
        """This end gave ``stream_id`` up with ``window`` bytes of it still allowed."""
        if len(self._late) >= _MAX_LATE_STREAMS:
            del self._late[next(iter(self._late))]  # the oldest
        self._late[stream_id] = window

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
                if not self._left:
                    self._complete()
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
                    f"not HTTP/2: the first frame is not SETTINGS (first bytes {head!r})"
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
        elif kind == _DATA:
            stream_id = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            allowed = self._late.get(stream_id, 0)
            if length <= allowed:
                self._late[stream_id] = allowed - length
                self._late_frame = True
        if kind in _CONTROL or kind > _CONTINUATION:
            self.control += 1
        self._left = length
        if not length:
            self._complete()

    def _complete(self) -> None:
        self.frames += 1
        if self._late_frame:
            self.late_data += 1
            self._late_frame = False
