"""Snapshots and forks: copies of a live session as it is now (API.md).

A snapshot is a checkpoint kept in the snapshot store, from which later creates start; a
fork checkpoints once into scratch space and starts its copies from it together. The
checkpoint itself is the session's (:meth:`Session.checkpoint`, :meth:`Session.copying`);
the copies are new rows of the session table (manager.py), reached through
:class:`CopyHost`.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import Literal, Protocol

from ..engines import StartTogether
from ..errors import DeskboxError, Internal, InvalidRequest, QuotaExceeded
from ..schemas.sessions import Resources, SessionCreate
from .catalog import SnapshotCatalog
from .fleet import Fleet
from .fork_scratch import ForkDirectories
from .in_flight import ChangesInFlight
from .lifecycle import SessionRecord, utcnow
from .session import Session
from .snapshots import SnapshotRecord, SnapshotStore

__all__ = ["CopyHost", "SessionCopies"]

log = logging.getLogger("deskbox.sessions")


class CopyHost(Protocol):
    """What copies need of the session table (manager.py)."""

    async def session(
        self, owner: str, session_id: str, missing: Literal["live", "running"] = "running"
    ) -> Session: ...

    def check_capacity(self, owner: str, count: int = 1) -> None: ...

    async def create_copy(self, owner: str, body: SessionCreate, checkpoint: Path,
                          together: StartTogether) -> SessionRecord:
        """A running session started from ``checkpoint`` beside the others of ``together``."""
        ...

    async def delete(self, owner: str, session_id: str) -> None: ...


class SessionCopies:
    def __init__(
        self, host: CopyHost, snapshots: SnapshotStore, catalog: SnapshotCatalog,
        forks: ForkDirectories, changes: ChangesInFlight, fleet: Fleet | None,
        snapshot_quota_mb: int, removals: set[asyncio.Task[None]],
    ) -> None:
        self._host = host
        self._snapshots = snapshots
        self._catalog = catalog
        self._forks = forks
        self._changes = changes
        self._fleet = fleet
        self._snapshot_quota_mb = snapshot_quota_mb
        # Background removals the server's shutdown waits for (the manager's).
        self._removals = removals

    async def snapshot(self, owner: str, session_id: str) -> SnapshotRecord:
        """Checkpoint a running session to a snapshot; it runs on (API.md)."""
        session = await self._host.session(owner, session_id, "live")
        session.require_checkpoint()
        _refuse_copies_of_volumes(session.record)
        # Soft: two snapshots taken at once may both pass, and a snapshot's size is known
        # only once it is taken. It keeps one key from filling the disk that every key's
        # hibernations and forks need.
        quota_mb = self._snapshot_quota_mb
        used_mb = sum(s.disk_bytes for s in await self._catalog.list(owner)) >> 20
        if used_mb >= quota_mb:
            raise QuotaExceeded(f"this API key's snapshots hold {used_mb} MB, its quota is "
                                f"{quota_mb} MB (DESKBOX_SNAPSHOT_QUOTA_MB); delete one first")
        return await self._changes.run(
            self._take_snapshot(session, owner), f"snapshot of session {session.record.id}")

    async def _take_snapshot(self, session: Session, owner: str) -> SnapshotRecord:
        record = session.record
        snapshot_id, directory = self._snapshots.new_id()
        try:
            info = await session.checkpoint(directory)
            snapshot = SnapshotRecord(
                id=snapshot_id, owner=owner, session_id=record.id, backend=record.backend,
                body=record.body.model_copy(update={"from_snapshot": None}),
                created_at=utcnow(), size_bytes=info.compressed_bytes or info.raw_bytes,
                raw_bytes=info.raw_bytes,
            )
            await asyncio.to_thread(self._snapshots.save, snapshot)
        except BaseException:
            # A checkpoint without its record (the session deleted while its agent came
            # back, or no room left for the record) is listed nowhere: only a restart
            # would remove it.
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, directory, True))
            raise
        log.info("session %s: snapshot %s (%.2f s, %d MiB)", record.id, snapshot_id,
                 info.seconds, snapshot.size_bytes >> 20)
        return snapshot

    async def fork(self, owner: str, session_id: str, count: int) -> list[SessionRecord]:
        """``count`` new running sessions, each a copy of this one as it is now.

        All or nothing: if one copy fails, the others are deleted and SessionFailed says why.
        """
        session = await self._host.session(owner, session_id, "live")
        record = session.record
        session.require_checkpoint()
        _refuse_copies_of_volumes(record)
        self._host.check_capacity(owner, count)
        if self._fleet is not None:
            await self._fleet.check_capacity(owner, count)
        room = (record.body.resources or Resources()).memory_mb << 20
        directory = await asyncio.to_thread(self._forks.new, room)
        results: list[SessionRecord | BaseException] = []
        try:
            started = time.monotonic()
            async with session.copying(directory):
                body = record.body.model_copy(update={"from_snapshot": None})
                together = StartTogether(count)
                results = await asyncio.gather(
                    *(self._copy(owner, body, directory, together) for _ in range(count)),
                    return_exceptions=True,
                )
        except BaseException:
            # The copies were made, then the source could not run on (deleted meanwhile,
            # its thaw failed): the caller hears an error and never their ids, so they go.
            await self._delete_all(owner, results)
            raise
        finally:
            self._remove_soon(directory)
        copies = [r for r in results if isinstance(r, SessionRecord)]
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self._delete_all(owner, results)
            if isinstance(errors[0], DeskboxError):
                raise errors[0]
            raise Internal(f"forking session {record.id} failed: {errors[0]!r}")
        log.info("session %s forked into %s (%.2f s)", record.id,
                 ", ".join(c.id for c in copies), time.monotonic() - started)
        return copies

    async def _delete_all(self, owner: str, results: list[SessionRecord | BaseException]
                          ) -> None:
        copies = [r for r in results if isinstance(r, SessionRecord)]
        await asyncio.shield(asyncio.gather(
            *(self._host.delete(owner, copy.id) for copy in copies), return_exceptions=True))

    async def _copy(
        self, owner: str, body: SessionCreate, checkpoint: Path, together: StartTogether
    ) -> SessionRecord:
        """One copy of a fork, running; one that fails lets the others run without it."""
        try:
            return await self._host.create_copy(owner, body, checkpoint, together)
        except BaseException:
            together.abort()
            raise

    def _remove_soon(self, directory: Path) -> None:
        """Remove a fork's checkpoint after its answer, not before: unlinking its images
        (~170 MB) took 10-20 ms of every fork. Shutdown waits for it; what a killed
        server left, the next start removes (Scratch.open, SnapshotStore.open)."""
        removal = asyncio.create_task(asyncio.to_thread(shutil.rmtree, directory, True))
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)


def _refuse_copies_of_volumes(record: SessionRecord) -> None:
    if record.body.all_volumes():
        raise InvalidRequest(
            "snapshots and forks of a session with volumes (or a browser profile) are not "
            "offered: a copy would be a second writer of its volumes"
        )
