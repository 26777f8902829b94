"""Pause, resume, snapshot and fork: the part of the session manager that stops or
checkpoints a desktop (pause.py, snapshots.py, links.py; the backend does the work).

:class:`StateChanges` is a base class of ``SessionManager``; it uses the manager's
sessions and lifecycle through the members declared at its top.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from ..backends.base import Backend, DesktopHandle, SnapshotInfo
from ..driver.images import EncodedImage
from ..errors import Conflict, DeskboxError, Internal, InvalidRequest, SessionFailed
from ..schemas import actions as a
from ..schemas.pause import PauseMode
from ..schemas.sessions import SessionCreate
from ..schemas.sessions import SessionState as S
from ..settings import Settings
from .browser_watch import BrowserWatch
from .lifecycle import SessionRecord, utcnow
from .links import SessionLinks
from .live import LiveSession, not_live
from .pause import DRAIN_TIMEOUT_S, FrameStore, LastFrame, drain, frozen_image
from .pool import SnapshotKey, WarmPool
from .registry import Registry
from .snapshots import SnapshotRecord, SnapshotStore

__all__ = ["StateChanges"]

log = logging.getLogger("deskbox.sessions")


class StateChanges:
    # What SessionManager provides.
    _live: dict[str, LiveSession]
    _backends: dict[str, Backend]
    _registry: Registry
    _browsers: BrowserWatch
    _frames: FrameStore
    links: SessionLinks
    snapshots: SnapshotStore
    pool: WarmPool | None
    _settings: Settings

    def _owned(self, owner: str, session_id: str) -> LiveSession:
        raise NotImplementedError

    def _publish_state(self, record: SessionRecord) -> None:
        raise NotImplementedError

    async def _fail_soon(self, live: LiveSession, reason: str) -> None:
        raise NotImplementedError

    def _check_capacity(self, owner: str, count: int = 1) -> None:
        raise NotImplementedError

    async def _create(
        self, owner: str, body: SessionCreate, wait: bool, snapshot: Path | None = None
    ) -> SessionRecord:
        raise NotImplementedError

    async def delete(self, owner: str, session_id: str) -> None:
        raise NotImplementedError

    # -- pause and resume (pause.py) ------------------------------------------------------

    async def pause(self, owner: str, session_id: str, mode: PauseMode) -> SessionRecord:
        """Freeze or hibernate a running session (pause.py); pausing it again changes
        nothing. Its state changes first, so no new work reaches the desktop; then what is
        in flight finishes, the last frame is kept, and the sandbox is frozen (or
        checkpointed: backends/checkpoint.py). On failure it runs on as before."""
        live = self._owned(owner, session_id)
        record = live.record
        target = S.paused if mode == "freeze" else S.hibernated
        async with live.changing:
            if record.state is target:
                return record
            handle = live.handle
            if record.state is not S.running or handle is None:
                raise not_live(record)
            backend = self._backends[record.backend]
            record.transition(target)

            def still_pausing() -> bool:  # a delete may come while pause waits
                return record.state is target

            try:
                await drain(lambda: live.busy, record.id, DRAIN_TIMEOUT_S)
                if still_pausing():
                    frame = await handle.worker.call(handle.desktop.grab_screen)
                if not still_pausing():
                    raise Conflict(f"session {record.id} was {record.state.value} meanwhile")
                # Its DevTools connection would time out on a frozen browser, and leads out
                # of the sandbox (CRIU cannot dump it): no watch meanwhile.
                await self._browsers.stop(record.id)
                if mode == "freeze":
                    await backend.freeze(handle)
                else:
                    # Kept on disk too: a server that restarts shows it until resumed.
                    await asyncio.to_thread(self._frames.save, record.id, frame)
                    async with self.links.closed(record.id):
                        await backend.hibernate(handle)
            except BaseException as error:
                if still_pausing():
                    record.transition(S.running)
                    self._browsers.start(record.id, handle)
                if mode == "hibernate":
                    await asyncio.to_thread(self._frames.forget, record.id)
                if isinstance(error, SessionFailed):  # e.g. its X server did not answer
                    await self._fail_soon(live, error.message)
                raise
            live.last_frame = LastFrame(frame, utcnow())
            record.touch()  # a paused session expires too, timeout_s after its pause
            await self._registry.save(record)
            self._publish_state(record)
        log.info("session %s %s", record.id, record.state.value)
        return record

    async def resume(self, owner: str, session_id: str) -> SessionRecord:
        """Thaw a paused session or restore a hibernated one; a running one stays as is."""
        live = self._owned(owner, session_id)
        record = live.record
        async with live.changing:
            if record.state is S.running:
                return record
            handle = live.handle
            if record.state not in (S.paused, S.hibernated) or handle is None:
                raise not_live(record)
            backend = self._backends[record.backend]
            if record.state is S.paused:
                await backend.thaw(handle)
            else:
                try:
                    await backend.restore(handle)
                except SessionFailed as error:
                    await self._fail_soon(live, error.message)
                    raise
            live.last_frame = None
            await asyncio.to_thread(self._frames.forget, record.id)
            record.transition(S.running)
            record.touch()
            await self._registry.save(record)
            self._publish_state(record)
            self._browsers.start(record.id, handle)
        log.info("session %s resumed", record.id)
        return record

    # -- snapshots and forks --------------------------------------------------------------

    @asynccontextmanager
    async def _checkpointing(self, live: LiveSession) -> AsyncIterator[DesktopHandle]:
        """A running session made ready for a checkpoint that leaves it running: actions
        get 409 meanwhile, those in flight finish, and no connection leads into it."""
        record = live.record
        handle = live.handle
        if record.state is not S.running or handle is None:
            raise not_live(record)
        live.checkpointing = True
        try:
            await drain(lambda: live.busy, record.id, DRAIN_TIMEOUT_S)
            await self._browsers.stop(record.id)
            try:
                async with self.links.closed(record.id):
                    yield handle
            finally:
                if record.state is S.running:
                    self._browsers.start(record.id, handle)
        finally:
            live.checkpointing = False

    async def snapshot(self, owner: str, session_id: str) -> SnapshotRecord:
        """Checkpoint a running session to a snapshot; it runs on (API.md)."""
        live = self._owned(owner, session_id)
        record = live.record
        backend = self._backends[record.backend]
        snapshot_id, directory = self.snapshots.new_id()
        async with live.changing, self._checkpointing(live) as handle:
            info = await self._checkpoint(live, backend, handle, directory, packed=True)
        snapshot = SnapshotRecord(
            id=snapshot_id, owner=owner, session_id=record.id, backend=record.backend,
            body=record.body.model_copy(update={"from_snapshot": None}),
            created_at=utcnow(), size_bytes=info.compressed_bytes or info.raw_bytes,
            raw_bytes=info.raw_bytes,
        )
        await asyncio.to_thread(self.snapshots.save, snapshot)
        log.info("session %s: snapshot %s (%.2f s, %d MiB)", record.id, snapshot_id,
                 info.seconds, snapshot.size_bytes >> 20)
        return snapshot

    async def _checkpoint(
        self, live: LiveSession, backend: Backend, handle: DesktopHandle, directory: Path,
        packed: bool,
    ) -> SnapshotInfo:
        try:
            return await backend.snapshot(handle, directory, packed)
        except SessionFailed as error:  # the desktop did not come back
            await self._fail_soon(live, error.message)
            raise

    async def fork(self, owner: str, session_id: str, count: int) -> builtins.list[SessionRecord]:
        """``count`` new running sessions, each a copy of this one as it is now.

        All or nothing: if one copy fails, the others are deleted and SessionFailed says why.
        """
        live = self._owned(owner, session_id)
        record = live.record
        backend = self._backends[record.backend]
        self._check_capacity(owner, count)
        directory = await asyncio.to_thread(self.snapshots.fork_directory)
        try:
            async with live.changing, self._checkpointing(live) as handle:
                started = time.monotonic()
                await self._checkpoint(live, backend, handle, directory, packed=False)
            body = record.body.model_copy(update={"from_snapshot": None})
            results = await asyncio.gather(
                *(self._create(owner, body, True, directory) for _ in range(count)),
                return_exceptions=True,
            )
        finally:
            await asyncio.to_thread(shutil.rmtree, directory, True)
        copies = [r for r in results if isinstance(r, SessionRecord)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(
                *(self.delete(owner, copy.id) for copy in copies), return_exceptions=True
            )
            if isinstance(errors[0], DeskboxError):
                raise errors[0]
            raise Internal(f"forking session {record.id} failed: {errors[0]!r}")
        log.info("session %s forked into %s (%.2f s)", record.id,
                 ", ".join(c.id for c in copies), time.monotonic() - started)
        return copies

    async def get_snapshot(self, owner: str, snapshot_id: str) -> SnapshotRecord:
        return await asyncio.to_thread(self.snapshots.get, owner, snapshot_id)

    async def list_snapshots(self, owner: str) -> builtins.list[SnapshotRecord]:
        return await asyncio.to_thread(self.snapshots.list, owner)

    async def delete_snapshot(self, owner: str, snapshot_id: str) -> None:
        snapshot = await asyncio.to_thread(self.snapshots.get, owner, snapshot_id)
        if self.pool is not None:
            await self.pool.set_target(self._pool_key(snapshot), 0)
        await asyncio.to_thread(self.snapshots.delete, owner, snapshot_id)

    def snapshot_pool_ready(self, snapshot: SnapshotRecord) -> int:
        return self.pool.ready(self._pool_key(snapshot)) if self.pool is not None else 0

    def _pool_key(self, snapshot: SnapshotRecord) -> SnapshotKey:
        return SnapshotKey(snapshot.id, snapshot.owner, self.snapshots.directory(snapshot.id))

    async def set_snapshot_pool(self, owner: str, snapshot_id: str, size: int) -> SnapshotRecord:
        """Keep ``size`` ready copies of a snapshot for its owner's creates from it.

        The copies of all of a key's snapshots count against its session cap, so that a
        pool cannot hold more desktops than the key could run.
        """
        snapshot = await asyncio.to_thread(self.snapshots.get, owner, snapshot_id)
        if self.pool is None:
            raise InvalidRequest("this server has no warm pool for the snapshot's backend")
        key = self._pool_key(snapshot)
        others = sum(self.pool.target(k) for k in self.pool.snapshot_keys(owner) if k != key)
        cap = self._settings.max_sessions_per_key
        if others + size > cap:
            raise InvalidRequest(
                f"the pools of this key's snapshots may keep {cap} copies in all "
                f"({others} kept for other snapshots)"
            )
        snapshot = snapshot.model_copy(update={"pool_size": size})
        await asyncio.to_thread(self.snapshots.save, snapshot)
        await self.pool.set_target(key, size)
        return snapshot

    async def frozen_screenshot(
        self,
        owner: str,
        session_id: str,
        fmt: Literal["jpeg", "png", "webp"],
        quality: int,
        scale: a.ScaleTo | None = None,
    ) -> EncodedImage | None:
        """The last frame of a paused or hibernated session, encoded; None otherwise."""
        live = self._live.get(session_id)
        frozen = (S.paused, S.hibernated)
        if live is None or live.record.owner != owner or live.record.state not in frozen:
            return None
        last = live.last_frame
        if last is None:  # still pausing: the screen is not frozen yet
            raise Conflict(f"session {session_id} is being paused; try again in a moment")
        view = live.record.body.coordinate_space
        return await asyncio.to_thread(frozen_image, last, fmt, quality, view, scale)
