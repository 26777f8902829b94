"""Sessions: the table of sessions (manager), one session's door (Session), the lifecycle
state machine and the SQLite registry."""

from __future__ import annotations

from .lifecycle import LIVE_STATES, SessionRecord
from .manager import LiveSession, SessionManager
from .registry import Registry
from .session import Session

__all__ = [
    "LIVE_STATES", "LiveSession", "Registry", "Session", "SessionManager", "SessionRecord",
]
