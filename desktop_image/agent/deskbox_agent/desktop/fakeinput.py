"""XTEST ``FakeInput`` requests packed with one ``struct.pack``.

python-xlib encodes a request through its generic field machinery, about 28 µs each here:
a click sends three, 100 typed characters more than 200 (a tenth of the ``type`` call). A
FakeInput request is 36 fixed bytes, so it is packed directly and queued on the same
connection, in order with every other request (``send_request`` numbers it like its own).
"""

from __future__ import annotations

import struct

from Xlib.display import Display
from Xlib.protocol import rq

__all__ = ["FakeInput"]

_X_TEST_FAKE_INPUT = 2  # the extension's minor opcode (xtestproto)
# opcode, minor, length in 4-byte units, type, detail, 2 pad, time, root, 8 pad, x, y, 8 pad;
# in the client's byte order, which python-xlib announced at connection set-up ("=").
_REQUEST = struct.Struct("=BBHBBxxIIxxxxxxxxhhxxxxxxxx")


class _Packed(rq.Request):
    """A request that expects no reply, already in bytes (rq.Request's __init__ would
    encode it through the generic machinery)."""

    def __init__(self, binary: bytes) -> None:
        self._binary = binary
        self._serial = None
        self._errorhandler = None


class FakeInput:
    """Queues fake key, button and motion events on ``display`` (sent at its next flush)."""

    def __init__(self, display: Display) -> None:
        self._protocol = display.display
        self._major: int = display.display.get_extension_major("XTEST")

    def request(self, event_type: int, detail: int = 0, x: int = 0, y: int = 0) -> bytes:
        """The request's bytes: time CurrentTime (0), root None (0: the pointer's screen)."""
        return _REQUEST.pack(self._major, _X_TEST_FAKE_INPUT, _REQUEST.size // 4,
                             event_type, detail, 0, 0, x, y)

    def send(self, event_type: int, detail: int = 0, x: int = 0, y: int = 0) -> None:
        self._protocol.send_request(_Packed(self.request(event_type, detail, x, y)), False)
