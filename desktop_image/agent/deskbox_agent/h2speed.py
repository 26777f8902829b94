"""One fix of h2's speed: it logs ``repr(frame)`` of every frame it receives, eagerly.

h2 (4.4) calls ``logger.trace("Received frame: %s", repr(frame))`` before it looks at the
logger, and hyperframe's repr hex-encodes the frame's WHOLE payload only to keep the first
20 hex digits. For a 140 KiB screenshot that is 280 KB of hex per response, a third of
the host's CPU for the call. :func:`install` replaces that helper by one that encodes
only the bytes it shows: the same text, at a cost independent of the payload.
"""

from __future__ import annotations

import binascii

import hyperframe.frame

__all__ = ["install", "short_data_repr"]


def short_data_repr(data: bytes | None) -> str:
    if not data:
        return "None"
    r = binascii.hexlify(data[:11]).decode("ascii")
    if len(data) > 10:
        r = r[:20] + "..."
    return "<hex:" + r + ">"


def install() -> None:
    """Idempotent; changes no output, only the cost of a repr."""
    hyperframe.frame._raw_data_repr = short_data_repr
