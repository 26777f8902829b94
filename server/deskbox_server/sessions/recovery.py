"""What a server finds of the previous one at start: the state dir's lock, and the
sessions it left live, re-adopted or marked failed (``SessionManager.start``)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from ..engines import AnyEngine
from ..engines.base import Capability
from ..engines.desktop_commands import DesktopSpec
from ..errors import DeskboxError, Internal, InvalidSetting
from ..schemas.sessions import Failure, SessionCreate
from ..schemas.sessions import SessionState as S
from .desktop import DEFAULT_CALL_TIMEOUT_S, AnyDesktop, Desktop
from .lifecycle import SessionRecord, utcnow
from .live import LiveSession
from .pause import FrameStore

__all__ = ["desktop_spec", "failed", "lock_state_dir", "readopt", "readopt_each"]

log = logging.getLogger("deskbox.sessions")
# Sessions re-adopted at once at a start. Each waits on its engine (a Kubernetes read the
# API server fails is asked again for up to 60 s; a VM's QMP and agent handshakes): one
# after another, N such sessions added N of those waits to the start. Not all at once: a
# start with hundreds would open as many connections to the API server (or the engine's
# daemon) and to the agents together.
ADOPT_AT_ONCE = 8


def lock_state_dir(state_dir: Path) -> int:
    """Hold ``state_dir/server.lock`` while we serve: one server per state dir.

    A second server would re-adopt (and at its shutdown destroy) the first one's sessions.
    """
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(state_dir / "server.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:  # read-only, another user's, a file: one line, not a traceback
        raise InvalidSetting(f"the state dir {state_dir} cannot be used: {error.strerror} "
                             "(DESKBOX_STATE_DIR or --state-dir)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Internal(f"another Deskbox server is using the state dir {state_dir}") from None
    return fd


async def readopt_each(
    records: Sequence[SessionRecord],
    adopt: Callable[[SessionRecord], Awaitable[bool]],
    at_once: int = ADOPT_AT_ONCE,
) -> list[bool]:
    """``adopt`` each record, ``at_once`` at a time; what each answered, in order. Each
    session's adoption is its own: one that fails fails that session alone (``adopt``
    says so). An error ``adopt`` raises (its registry failed) ends the others', and is
    raised as it was when they ran one after another."""
    gate = asyncio.Semaphore(at_once)

    async def one(record: SessionRecord) -> bool:
        async with gate:
            return await adopt(record)

    failure: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(record), name=f"deskbox-readopt-{record.id}")
                     for record in records]
    except BaseExceptionGroup as errors:
        failure = errors.exceptions[0]
    if failure is not None:  # raised out of the handler: not chained to its group
        raise failure
    return [task.result() for task in tasks]


async def readopt(
    record: SessionRecord, engine: AnyEngine | None, frames: FrameStore,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> LiveSession | str:
    """A session a previous server left running (or hibernated), taken over; or why not."""
    if engine is None:
        return f"the server restarted without the {record.backend!r} backend"
    if record.state not in (S.running, S.hibernated):
        return f"the server restarted while the session was {record.state.value}"
    if Capability.ADOPT not in engine.capabilities:
        return f"the server restarted, and the {engine.name} engine's sandboxes end with it"
    last_frame = None
    try:
        if record.state is S.hibernated:
            handle = await Desktop.adopt(engine, record.id, True, call_timeout_s)
            last_frame = await asyncio.to_thread(frames.load, record.id)
        else:
            try:
                handle = await Desktop.adopt(engine, record.id, False, call_timeout_s)
            except DeskboxError as error:
                handle = await _hibernated_unsaid(record, engine, call_timeout_s, error)
                last_frame = await asyncio.to_thread(frames.load, record.id)
    except DeskboxError as error:
        return f"the server restarted and could not re-adopt it: {error.message}"
    except Exception as error:
        log.exception("re-adopting session %s", record.id)
        return f"the server restarted and could not re-adopt it: {type(error).__name__}"
    return LiveSession(record, handle, last_frame=last_frame)


async def _hibernated_unsaid(
    record: SessionRecord, engine: AnyEngine, call_timeout_s: float, error: DeskboxError,
) -> AnyDesktop:
    """A running session whose sandbox no longer runs, but was checkpointed whole: the
    previous server was killed (or its disk was full) between a hibernate's dump and the
    save of its new state. It is hibernated (its archive is renamed into place whole, or
    is not there), not lost; else ``error``, why it could not be adopted running."""
    if Capability.CHECKPOINT not in engine.capabilities:
        raise error
    try:
        handle = await Desktop.adopt(engine, record.id, True, call_timeout_s)
    except DeskboxError:
        raise error from None
    log.warning("session %s: hibernated by the previous server, which did not say so",
                record.id)
    record.transition(S.hibernated)
    return handle


def desktop_spec(body: SessionCreate) -> DesktopSpec:
    return DesktopSpec(
        width=body.display.width,
        height=body.display.height,
        dpi=body.display.dpi,
        start_url=body.browser.start_url,
    )


def failed(record: SessionRecord, reason: str) -> SessionRecord:
    record.state = S.failed
    record.failure = Failure(reason=reason, at=utcnow())
    record.expires_at = None
    record.ended_at = record.failure.at
    return record
