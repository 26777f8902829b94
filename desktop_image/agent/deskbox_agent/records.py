"""The record framing of streamed exec output (PROTOCOL.md "POST /v1/exec").

A record is one kind byte, a 4-byte big-endian payload length, then the payload:
``o`` stdout bytes, ``e`` stderr bytes, ``x`` the final status (a JSON object), always
last. HTTP/2 DATA frames are not message boundaries, so the body carries its own.
"""

from __future__ import annotations

import struct

__all__ = ["EXIT", "HEADER", "MAX_RECORD", "STDERR", "STDOUT", "record"]

STDOUT = b"o"
STDERR = b"e"
EXIT = b"x"
HEADER = struct.Struct(">cI")
MAX_RECORD = 64 * 1024


def record(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload
