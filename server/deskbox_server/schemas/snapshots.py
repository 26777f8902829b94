"""Snapshots and forks on the wire (API.md: ``/v1/sessions/{id}/snapshots``,
``/v1/snapshots/{id}``, ``/v1/sessions/{id}/fork``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from .scalars import IntOnly
from .sessions import Browser, Display, Session

__all__ = [
    "MAX_FORKS", "MAX_SNAPSHOT_POOL", "ForkRequest", "Forks", "PoolRequest", "Snapshot",
    "SnapshotList", "SnapshotPool",
]

# Copies per fork call: each is a full desktop, restored at once.
MAX_FORKS = 16
# Ready copies one snapshot may keep in the warm pool (PUT /v1/snapshots/{id}/pool).
MAX_SNAPSHOT_POOL = 4


class SnapshotPool(BaseModel):
    size: int  # ready copies the warm pool keeps of this snapshot
    ready: int  # of which are ready now


class PoolRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: Annotated[int, Field(ge=0, le=MAX_SNAPSHOT_POOL), IntOnly]


class Snapshot(BaseModel):
    id: str
    session_id: str  # the session it was taken of (which may have ended since)
    backend: str
    display: Display
    browser: Browser
    created_at: datetime
    size_bytes: int  # on disk, compressed
    raw_bytes: int  # the checkpoint's images before compression (about the memory it held)
    pool: SnapshotPool


class SnapshotList(BaseModel):
    snapshots: list[Snapshot]


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: Annotated[int, Field(ge=1, le=MAX_FORKS), IntOnly] = 1


class Forks(BaseModel):
    sessions: list[Session]
