"""Snapshots on disk: ``<state>/snapshots/<id>/`` (mode 0700), one directory each.

The backend writes its checkpoint into the directory (engines/runc/snapshot.py); this
store adds ``snapshot.json`` (mode 0600: owner, source session, sizes) last, so a directory
without it is a snapshot that never finished (the server died meanwhile) and is removed at
start. Snapshots outlive the server: the directory is the whole truth, nothing else indexes
it. Forks checkpoint in memory, or into ``<state>/snapshots/.forks/`` (fork_scratch.py), and
remove it once the copies run. While a pool keeps copies of a snapshot, its engine may keep
its images unpacked in its directory too (keep_for_restores); they go when the pool does.

The files hold the session's memory: only the server's user can read them.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import threading
from collections import Counter
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ..errors import NO_ROOM, Conflict, InsufficientStorage, NotFound
from ..schemas.sessions import SessionCreate
from .atomic_file import replace_file

__all__ = ["SnapshotRecord", "SnapshotStore"]

log = logging.getLogger("deskbox.sessions")
_ID = re.compile(r"^snap_[0-9a-f]{20}$")
_RECORD = "snapshot.json"
_FORKS = ".forks"


class SnapshotRecord(BaseModel):
    id: str
    owner: str
    session_id: str
    backend: str
    body: SessionCreate  # the source session's create body: display, browser, resources
    created_at: datetime
    size_bytes: int
    raw_bytes: int
    pool_size: int = 0  # ready copies the warm pool keeps (PUT /v1/snapshots/{id}/pool)

    @property
    def disk_bytes(self) -> int:
        """What it takes on disk, as the key's quota counts it: its archive, and while a
        pool keeps copies, its images unpacked for their restores (about ``raw_bytes``)."""
        return self.size_bytes + (self.raw_bytes if self.pool_size else 0)


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        # A delete runs on a worker thread and a restore takes hold on the event loop: the
        # lock makes "not in use, so gone" and "not gone, so in use" exclusive.
        self._lock = threading.Lock()
        self._in_use: Counter[str] = Counter()
        self._deleted: set[str] = set()  # by this server: their records may linger a moment
        # Images an engine keeps unpacked for a pool's restores (kept_for_restores) that no
        # pool wants any more, left until the restores reading them end.
        self._unwanted: dict[str, Path] = {}

    def open(self) -> None:
        """Create the directory; remove what a previous server left half-written."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        shutil.rmtree(self.root / _FORKS, ignore_errors=True)
        for entry in self.root.iterdir():
            if entry.is_dir() and not (entry / _RECORD).is_file():
                log.warning("removing the unfinished snapshot %s", entry.name)
                shutil.rmtree(entry, ignore_errors=True)

    def directory(self, snapshot_id: str) -> Path:
        """Where the snapshot's files are (the backend's checkpoint and our record)."""
        return self.root / snapshot_id

    def new_id(self) -> tuple[str, Path]:
        """A fresh id and the directory (not yet made) the backend writes into."""
        snapshot_id = "snap_" + secrets.token_hex(10)
        return snapshot_id, self.directory(snapshot_id)

    @property
    def forks_on_disk(self) -> Path:
        """Where forks checkpoint when not in memory (fork_scratch.py); cleared at open."""
        return self.root / _FORKS

    def save(self, record: SnapshotRecord) -> None:
        try:
            replace_file(self.directory(record.id) / _RECORD, record.model_dump_json().encode())
        except OSError as error:
            if error.errno in NO_ROOM:
                raise InsufficientStorage(
                    f"no room on the server's disk for snapshot {record.id}'s record: "
                    f"{error.strerror}") from None
            raise

    def _read(self, snapshot_id: str) -> SnapshotRecord | None:
        if not _ID.match(snapshot_id):
            return None
        try:
            return SnapshotRecord.model_validate_json(
                (self.directory(snapshot_id) / _RECORD).read_bytes()
            )
        except FileNotFoundError:
            return None
        except ValidationError:
            log.warning("the record of snapshot %s is unreadable", snapshot_id)
            return None

    def get(self, owner: str, snapshot_id: str) -> SnapshotRecord:
        record = self._read(snapshot_id)
        if record is None or record.owner != owner:
            raise NotFound(f"no snapshot {snapshot_id!r}")
        return record

    def all(self) -> list[SnapshotRecord]:
        records = [self._read(entry.name) for entry in self.root.iterdir()]
        return [r for r in records if r is not None]

    def list(self, owner: str) -> list[SnapshotRecord]:
        mine = [r for r in self.all() if r.owner == owner]
        return sorted(mine, key=lambda r: r.created_at)

    def hold(self, snapshot: SnapshotRecord) -> Path:
        """The snapshot's directory, kept from deletion until :meth:`release`; NotFound if
        a delete came after its record was read. Reads nothing from disk."""
        with self._lock:
            if snapshot.id in self._deleted:
                raise NotFound(f"no snapshot {snapshot.id!r}")
            self._in_use[snapshot.id] += 1
        return self.directory(snapshot.id)

    def restoring(self, snapshot_id: str) -> bool:
        """Whether a restore holds the snapshot now (a delete is refused meanwhile)."""
        with self._lock:
            return self._in_use[snapshot_id] > 0

    def release(self, snapshot_id: str) -> bool:
        """True: the last restore reading unpacked images no pool wants has ended; the
        caller removes them now (:meth:`drop_unwanted`, on a worker thread)."""
        with self._lock:
            self._in_use[snapshot_id] -= 1
            if self._in_use[snapshot_id] > 0:
                return False
            del self._in_use[snapshot_id]
            return snapshot_id in self._unwanted

    def begin_delete(self, owner: str, snapshot_id: str) -> SnapshotRecord:
        """Conflict if a restore reads the snapshot; else none may begin from it any more
        (:meth:`hold`: NotFound) until :meth:`finish_delete` removes it or
        :meth:`cancel_delete` keeps it. What goes with it (its pool's copies) goes between,
        once the delete is sure."""
        record = self.get(owner, snapshot_id)
        with self._lock:
            if self._in_use[snapshot_id]:
                raise Conflict(f"snapshot {snapshot_id} is being restored; delete it afterwards")
            if snapshot_id in self._deleted:
                raise NotFound(f"no snapshot {snapshot_id!r}")  # another delete's
            self._deleted.add(snapshot_id)
        return record

    def finish_delete(self, snapshot_id: str) -> None:
        directory = self.directory(snapshot_id)
        # Renamed first: a crash halfway leaves a directory open() removes, not half a one.
        doomed = self.root / _FORKS / f"deleted-{snapshot_id}"
        try:
            (self.root / _FORKS).mkdir(mode=0o700, exist_ok=True)
            os.replace(directory, doomed)
        except BaseException:
            self.cancel_delete(snapshot_id)  # it is still whole, and still there
            raise
        with self._lock:
            self._unwanted.pop(snapshot_id, None)
        shutil.rmtree(doomed, ignore_errors=True)

    def cancel_delete(self, snapshot_id: str) -> None:
        with self._lock:
            self._deleted.discard(snapshot_id)

    # -- images kept unpacked for a pool ---------------------------------------------------

    def want_unpacked(self, snapshot_id: str) -> None:
        """A pool keeps copies of the snapshot (again): its unpacked images stay."""
        with self._lock:
            self._unwanted.pop(snapshot_id, None)

    def drop_unpacked(self, snapshot_id: str, unpacked: Path) -> None:
        """Remove ``unpacked``, the images an engine keeps for a pool's restores, now or
        once no restore reads the snapshot (:meth:`release`)."""
        with self._lock:
            self._unwanted[snapshot_id] = unpacked
        self.drop_unwanted(snapshot_id)

    def drop_unwanted(self, snapshot_id: str) -> None:
        with self._lock:
            if self._in_use[snapshot_id]:
                return
            unpacked = self._unwanted.pop(snapshot_id, None)
            if unpacked is None:  # wanted again meanwhile
                return
            # Renamed under the lock: a restore beginning after it reads the archive, and
            # none finds half of the images. Into the forks' directory, which open() clears.
            aside = self.root / _FORKS / f"unpacked-{snapshot_id}-{secrets.token_hex(4)}"
            (self.root / _FORKS).mkdir(mode=0o700, exist_ok=True)
            try:
                os.replace(unpacked, aside)
            except FileNotFoundError:  # none unpacked, or the snapshot deleted
                return
        shutil.rmtree(aside, ignore_errors=True)
