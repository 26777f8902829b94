"""Wire model of the session event stream (``GET /v1/sessions/{id}/events``, API.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from .sessions import SessionState

__all__ = ["EventType", "SessionEvent"]

EventType = Literal["state", "browser_exited", "browser_restarted", "help_requested",
                    "human_took_control", "human_handed_back", "recording_started",
                    "recording_stopped", "server_stopping", "sandbox_held",
                    "sandbox_released"]


class SessionEvent(BaseModel):
    """One event. ``id``: greater than every earlier event's, across restarts of the server
    and the servers of a fleet (their clock in microseconds; only its order means anything),
    so ``Last-Event-ID`` resumes a stream on any of them. ``state``: the session entered
    ``state`` (``reason`` for ``failed``); ``browser_exited``: its browser went away (crash,
    ``Browser.close``, window closed), DevTools clients were disconnected;
    ``browser_restarted``: a new browser answers, with the same profile,
    ``browser_restarts`` times so far; ``help_requested``: the agent asked for a human
    (``reason``); ``human_took_control``: a human drives the desktop, the agent's actions
    answer 409; ``human_handed_back``: the agent may act again (``reason``: handed back, or
    the lease ran out); ``recording_started``, ``recording_stopped`` (``reason``: asked, the
    session ended, the quota was reached); ``server_stopping``: the server is stopping and
    the stream ends (the session is stopped with it unless hibernated; a client reconnects
    to the next server with ``Last-Event-ID``); ``sandbox_held``: someone else paused its
    sandbox (a ``docker pause``, a ``runc pause``: ``reason``), its calls answer 409;
    ``sandbox_released``: it runs again."""

    id: int
    type: EventType
    at: datetime
    session_id: str
    state: SessionState | None = None
    reason: str | None = None
    browser_restarts: int | None = None
