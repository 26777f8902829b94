"""Pause, resume and checkpoints: what stops or checkpoints one session's desktop
(pause.py, links.py; its Desktop and engine do the work, desktop.py). ``Session``
(session.py) calls them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from ..engines.base import SnapshotInfo
from ..errors import Conflict, DeskboxError, SessionFailed
from ..schemas.pause import PauseMode
from ..schemas.sessions import SessionState as S
from .context import SessionContext
from .desktop import AnyDesktop
from .lifecycle import SessionRecord, utcnow
from .live import LiveSession, not_live
from .pause import DRAIN_TIMEOUT_S, LastFrame, drain

__all__ = ["checkpoint", "copying", "pause", "resume"]

log = logging.getLogger("deskbox.sessions")
T = TypeVar("T")


async def pause(
    live: LiveSession, context: SessionContext, mode: PauseMode
) -> SessionRecord:
    """Freeze or hibernate a running session (pause.py); pausing it again changes nothing.
    Its state changes first, so no new work reaches the desktop; then what is in flight
    finishes, the last frame is kept, and the sandbox is frozen (or checkpointed:
    engines/runc/criu.py). On failure it runs on as before."""
    record = live.record
    target = S.paused if mode == "freeze" else S.hibernated
    async with live.changing:
        if record.state is target:
            return record
        handle = live.handle
        if record.state is not S.running or handle is None:
            raise not_live(record)
        handle.require_pause(mode)
        record.transition(target)

        def still_pausing() -> bool:  # a delete may come while pause waits
            return record.state is target

        stopped = False  # frozen or checkpointed: what a failure after it undoes
        try:
            await drain(lambda: live.busy, record.id, DRAIN_TIMEOUT_S)
            if still_pausing():
                # A recording takes its last frame through the agent: it stops while the
                # agent grabs the screen, neither waiting for the other.
                packed = await _beside(handle.grab(), context.recordings.unwatch(record.id))
            if not still_pausing():
                raise Conflict(f"session {record.id} was {record.state.value} meanwhile")
            # The browser's DevTools connection leads out of the sandbox (CRIU cannot dump
            # it, a frozen browser holds it): no watch meanwhile. It is let go only now,
            # not during the grab: the browser handling the hang-up beside the capture
            # made a pause on a page of text 1.5 ms slower (bench/README.md).
            let_go = context.browsers.stop(record.id)
            if mode == "freeze":
                # The agent's part is done: the host unpacks the frame while it freezes.
                # The watch is aborted, so nothing waits for a browser frozen meanwhile.
                frame = await _beside(packed.unpack(), _beside(handle.freeze(), let_go))
            else:
                frame = await _beside(packed.unpack(), let_go)
                # Kept on disk too: a server that restarts shows it until resumed.
                await asyncio.to_thread(context.frames.save, record.id, frame)
                async with context.links.closed(record.id):
                    await handle.hibernate()
            stopped = True
            live.last_frame = LastFrame(frame, utcnow())
            record.touch()  # a paused session expires too, timeout_s after its pause
            # A state the registry cannot take (a full disk: 507) is undone below: the
            # session is as it was (API.md), not paused and listed running.
            await context.registry.save(record)
        except BaseException as error:
            cause: BaseException = error
            live.last_frame = None
            if still_pausing() and stopped:
                cause = await _run_again(live, handle, mode) or error
            if still_pausing():
                record.transition(S.running)
                context.watch(record.id, handle)
                # A keepalive meanwhile saved the state it saw, paused: the registry (the
                # listing, a restart's recovery) says what is true again.
                with contextlib.suppress(DeskboxError):
                    await context.registry.save(record)
            if mode == "hibernate":
                await asyncio.to_thread(context.frames.forget, record.id)
            if isinstance(cause, SessionFailed):  # e.g. its X server did not answer
                instead = await context.fail(live, cause.message)
                if instead is not None:  # it was deleted meanwhile: no fault of its own
                    raise instead from cause
            if cause is not error:
                raise cause from error
            raise
        context.publish(record)
    log.info("session %s %s", record.id, record.state.value)
    return record


async def resume(live: LiveSession, context: SessionContext) -> SessionRecord:
    """Thaw a paused session or restore a hibernated one; a running one stays as is."""
    record = live.record
    async with live.changing:
        if record.state is S.running:
            return record
        handle = live.handle
        before = record.state
        if before not in (S.paused, S.hibernated) or handle is None:
            raise not_live(record)
        if before is S.paused:
            # Saved before the thaw, which cannot be undone as simply: a state the registry
            # cannot take (a full disk: 507) leaves the session paused, as it was. A server
            # killed in between leaves a frozen sandbox of a session said to run: the next
            # one thaws it as it takes the session over (Engine.adopt).
            await context.registry.save(_resumed(record))
        async with live.restoring:
            try:
                if before is S.paused:
                    await handle.thaw()
                else:
                    await handle.restore()
            except Exception as error:
                if record.state is not before:  # deleted meanwhile
                    raise _deleted_meanwhile(record, "resumed") from error
                if isinstance(error, SessionFailed) and before is S.hibernated:
                    instead = await context.fail(live, error.message)
                    if instead is not None:
                        raise instead from error
                elif before is S.paused:  # still paused, as the registry says again
                    with contextlib.suppress(DeskboxError):
                        await context.registry.save(record)
                raise
        if record.state is not before:  # a delete does not wait for ``changing``
            raise _deleted_meanwhile(record, "resumed")
        live.last_frame = None
        await asyncio.to_thread(context.frames.forget, record.id)
        record.transition(S.running)
        record.touch()
        # It runs, whatever the registry takes: its browser and recording are watched
        # again before the save (a restored hibernation's 507 says the registry lags).
        context.publish(record)
        context.watch(record.id, handle)
        await context.registry.save(record)
    log.info("session %s resumed", record.id)
    return record


def _resumed(record: SessionRecord) -> SessionRecord:
    """What ``record`` will be once its session runs again (its idle clock restarted)."""
    after = dataclasses.replace(record)
    after.transition(S.running)
    after.touch()
    return after


async def _run_again(live: LiveSession, handle: AnyDesktop, mode: PauseMode
                     ) -> SessionFailed | None:
    """Undo a freeze or a hibernate whose new state was not saved: thaw or restore the
    desktop; why it did not run again, if it did not (the caller fails the session)."""
    try:
        if mode == "freeze":
            await handle.thaw()
        else:
            async with live.restoring:  # a delete meanwhile waits, as for a resume
                await handle.restore()
    except SessionFailed as error:
        return error
    return None


def _deleted_meanwhile(record: SessionRecord, doing: str) -> Conflict:
    return Conflict(f"session {record.id} was {record.state.value} while it {doing}")


async def _beside(main: Awaitable[T], other: Awaitable[object]) -> T:
    """``main``'s result once ``other`` has ended too: the two run at once, and an error
    of either is raised only when both are over (a pause leaves nothing running)."""
    result, other_result = await asyncio.gather(main, other, return_exceptions=True)
    if isinstance(result, BaseException):
        raise result
    if isinstance(other_result, BaseException):
        raise other_result
    return result


@asynccontextmanager
async def _checkpointing(
    live: LiveSession, context: SessionContext
) -> AsyncIterator[AnyDesktop]:
    """A running session made ready for a checkpoint that leaves it running: actions get
    409 meanwhile, those in flight finish, and no connection leads into it."""
    record = live.record
    handle = live.handle
    if record.state is not S.running or handle is None:
        raise not_live(record)
    handle.require_checkpoint()
    live.checkpointing = True
    try:
        await drain(lambda: live.busy, record.id, DRAIN_TIMEOUT_S)
        await context.unwatch(record.id)
        try:
            async with context.links.closed(record.id):
                yield handle
        finally:
            if record.state is S.running:
                context.watch(record.id, handle)
    except DeskboxError as error:
        if record.state in (S.stopping, S.stopped):
            # A delete killed the sandbox under the checkpoint: what failed then (its
            # agent gone, CRIU's dump cut short) is no fault of the desktop's.
            raise Conflict(f"session {record.id} was deleted while it was "
                           "checkpointed") from error
        raise
    finally:
        live.checkpointing = False


async def checkpoint(
    live: LiveSession, context: SessionContext, directory: Path
) -> SnapshotInfo:
    """Checkpoint the running session into the new ``directory``, compressed, to keep (a
    snapshot); it runs on."""
    async with live.changing, _checkpointing(live, context) as handle:
        return await _snapshot(live, context, handle, directory, True)


@asynccontextmanager
async def copying(
    live: LiveSession, context: SessionContext, directory: Path
) -> AsyncIterator[SnapshotInfo]:
    """Checkpoint the running session into the new ``directory`` for copies made within
    the block (a fork), raw. Until the block ends the session stays as during its
    checkpoint (actions get 409) and, if its engine can freeze it, frozen: the copies'
    restores are bound by the CPU, which its page would take otherwise (an animated one;
    bench/README.md, "the copies let go together"). Then it runs on."""
    async with live.changing, _checkpointing(live, context) as handle:
        info = await _snapshot(live, context, handle, directory, False)
        held = await _hold(handle, live.record.id)
        try:
            yield info
        finally:
            if held:
                try:
                    await handle.thaw()
                except SessionFailed as error:
                    await context.fail(live, error.message)
                    raise


async def _snapshot(
    live: LiveSession, context: SessionContext, handle: AnyDesktop, directory: Path,
    packed: bool,
) -> SnapshotInfo:
    try:
        return await handle.snapshot(directory, packed)
    except SessionFailed as error:  # the desktop did not come back
        await context.fail(live, error.message)
        raise


async def _hold(handle: AnyDesktop, session_id: str) -> bool:
    """Freeze the desktop if its engine can; whether it is frozen. Best effort: a freeze
    that did not finish thawed the sandbox again, and the copies are made all the same."""
    if not handle.can_freeze:
        return False
    try:
        await handle.freeze()
    except SessionFailed as error:
        log.warning("session %s was not held still for its copies: %s", session_id,
                    error.message)
        return False
    return True
