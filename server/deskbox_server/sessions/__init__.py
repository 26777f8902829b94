"""Sessions: the lifecycle state machine, the SQLite registry and the manager."""

from __future__ import annotations

from .lifecycle import LIVE_STATES, SessionRecord
from .manager import LiveSession, SessionManager
from .registry import Registry

__all__ = ["LIVE_STATES", "LiveSession", "Registry", "SessionManager", "SessionRecord"]
