"""The binary reply shape of the desktop's calls: ``application/vnd.deskbox.parts``.

A 4-byte big-endian length N, N bytes of a UTF-8 JSON object (the header), then the raw
bytes of the parts (images, clipboard text, pixels) that the header points at by
``offset`` and ``length``, counted from the first byte after the header. PROTOCOL.md says
why: no base64, one pass, and a header the host bounds before it reads a part.
"""

from __future__ import annotations

import json
import struct

from ..registry import Blob, Json

__all__ = ["CONTENT_TYPE", "Parts"]

CONTENT_TYPE = "application/vnd.deskbox.parts"
_LENGTH = struct.Struct(">I")


class Parts:
    """Collects parts; :meth:`add` returns where one will be, :meth:`blob` the reply."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self._size = 0

    def add(self, data: bytes) -> dict[str, Json]:
        place: dict[str, Json] = {"offset": self._size, "length": len(data)}
        self._chunks.append(data)
        self._size += len(data)
        return place

    def blob(self, header: dict[str, Json]) -> Blob:
        head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        return Blob(b"".join((_LENGTH.pack(len(head)), head, *self._chunks)), CONTENT_TYPE)
