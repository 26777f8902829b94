"""How much a sandbox's X server may send us.

The X server of a session runs inside its sandbox, so every length in what it sends is
untrusted: a reply or a GenericEvent states its own length (up to 16 GiB), and both X
libraries we use (python-xlib, libxcb) would allocate and read whatever it states. The
largest legitimate message is a full-screen GetImage reply, so one screen's pixels plus a
margin bound every reply and event; the screen itself is at most what Deskbox ever makes.
Events are bounded in number too (queued, and per second).

A breach ends that session's desktop (``DesktopFailed``), never the control plane.
"""

from __future__ import annotations

import time

from ..errors import DesktopFailed
from ..schemas.actions import MAX_PIXELS

__all__ = [
    "EVENT_BURST",
    "EVENT_RATE",
    "MAX_QUEUED_EVENTS",
    "EventBudget",
    "flood",
    "mib",
    "oversize",
    "reply_limit",
]

MIB = 1 << 20
# Headers, and every smaller reply we read (keymaps, properties, cursor images).
_MARGIN = MIB
MAX_QUEUED_EVENTS = 10_000
# The events an X server may send a connection: a burst, then this many per second. Ours see
# a few DamageNotify/PropertyNotify/MappingNotify a second, hundreds while a browser starts.
EVENT_BURST = 10_000
EVENT_RATE = 2_000.0


def reply_limit(width: int, height: int) -> int:
    """The largest reply or event accepted from the X server of a ``width`` x ``height`` screen."""
    if width <= 0 or height <= 0 or width * height > MAX_PIXELS:
        raise DesktopFailed(
            f"the X server reports a {width}x{height} screen (at most {MAX_PIXELS} pixels)"
        )
    return width * height * 4 + _MARGIN


def mib(size: int) -> str:
    return f"{size / MIB:.1f}".removesuffix(".0") + " MiB"


def oversize(kind: str, size: int, limit: int) -> str:
    return f"the X server sent a {mib(size)} {kind} (limit {mib(limit)})"


def flood() -> str:
    return f"the X server sent more than {EVENT_BURST} events at over {EVENT_RATE:.0f} a second"


class EventBudget:
    """A token bucket: ``EVENT_BURST`` events at once, refilled at ``EVENT_RATE`` a second."""

    def __init__(self, burst: int = EVENT_BURST, rate: float = EVENT_RATE) -> None:
        self._burst = float(burst)
        self._rate = rate
        self._tokens = float(burst)
        self._at = time.monotonic()

    def spend(self, count: int) -> bool:
        """Take ``count`` events; False once the server has sent more than the budget."""
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate) - count
        self._at = now
        return self._tokens >= 0
