"""Recordings on the wire (API.md "Recordings and trajectories"): a session's recording
and the list of an API key's recordings. The trajectory itself is JSON lines
(sessions/recording_store.py writes them)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Recording", "RecordingList", "RecordingState"]

RecordingState = Literal["recording", "stopped"]


class Recording(BaseModel):
    session_id: str
    state: RecordingState
    started_at: datetime
    stopped_at: datetime | None = None
    # Why it stopped when it was not asked to: "the session ended", "quota"...
    stop_reason: str | None = None
    # Deleted then, with its frames and video; None while it records.
    expires_at: datetime | None = None
    frames: int
    actions: int
    bytes: int
    width: int | None = None
    height: int | None = None


class RecordingList(BaseModel):
    recordings: list[Recording] = Field(description="newest first")
    next_cursor: str | None = Field(
        default=None,
        description="pass as ?cursor= for the next page; null on the last page",
    )
