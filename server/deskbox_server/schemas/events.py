"""Wire model of the session event stream (``GET /v1/sessions/{id}/events``, API.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from .sessions import SessionState

__all__ = ["EventType", "SessionEvent"]

EventType = Literal["state", "browser_exited", "browser_restarted"]


class SessionEvent(BaseModel):
    """One event. ``state``: the session entered ``state`` (``reason`` for ``failed``);
    ``browser_exited``: its browser went away (crash, ``Browser.close``, window closed),
    DevTools clients were disconnected; ``browser_restarted``: a new browser answers, with
    the same profile, ``browser_restarts`` times so far."""

    id: int
    type: EventType
    at: datetime
    session_id: str
    state: SessionState | None = None
    reason: str | None = None
    browser_restarts: int | None = None
