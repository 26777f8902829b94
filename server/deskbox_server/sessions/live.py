"""A session this server holds: its record, its desktop and what is going on with it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..errors import Conflict, DeskboxError, InvalidRequest, NotFound, SessionFailed
from ..schemas.sessions import SessionState as S
from .desktop import AnyDesktop
from .handoff import HandoffState
from .lifecycle import SessionRecord
from .pause import LastFrame

__all__ = ["LiveSession", "not_live", "one_server_only"]


@dataclass
class LiveSession:
    record: SessionRecord
    handle: AnyDesktop | None = None
    start_task: asyncio.Task[None] | None = None
    stop_task: asyncio.Task[None] | None = None
    # Actions in flight: the reaper never expires a session that is busy.
    busy: int = 0
    # Pause, resume, snapshot and fork, one at a time; the screen when it was paused.
    changing: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Held while a resume thaws or restores the desktop: a delete, which does not wait for
    # ``changing``, waits for this before it removes the sandbox, so that no restore brings
    # processes back after the removal.
    restoring: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_frame: LastFrame | None = None
    # Set while a snapshot or fork checkpoints the running desktop: actions get 409.
    checkpointing: bool = False
    # The last batch still on its way to the desktop behind an await (a secret's focus
    # check): later batches wait for it, so that batches reach the desktop in order.
    last_in_line: asyncio.Future[None] | None = None
    # A human's control from the live view, and the agent's requests for help (made on
    # first use: Session.handoff).
    handoff: HandoffState | None = None
    # Why someone else paused its sandbox, as the reaper last saw (a docker or runc pause).
    held: str | None = None


def not_live(record: SessionRecord) -> DeskboxError:
    if record.state is S.starting:
        return Conflict(f"session {record.id} is still starting")
    if record.state in (S.paused, S.hibernated):
        return Conflict(f"session {record.id} is {record.state.value}; resume it first")
    if record.state is S.failed:
        reason = record.failure.reason if record.failure else "unknown"
        return SessionFailed(f"session {record.id} has failed: {reason}")
    return NotFound(f"session {record.id} is {record.state.value}")


def one_server_only(what: str) -> InvalidRequest:
    """What needs one server's disk or memory for the session's whole life, refused in a
    fleet whose servers share the sessions (any of them may serve the next request)."""
    return InvalidRequest(
        f"{what} is not offered when servers share their sessions (DESKBOX_REGISTRY="
        "cluster): it is kept by one server, and the next request may reach another")
