"""Persistent volumes of API keys, and which sessions have them attached.

On disk, ``<state>/volumes/<key id>/<name>/`` (mode 0700) holds ``volume.json`` (written
last: a directory without it never finished and is removed at start) and ``disk.ext4``
(engines/volumes.py). Volumes outlive sessions and the server; attachments live in memory
and are made again from the sessions a restarted server re-adopts.

A volume has one writer, or any number of readers: a second attach that would break that
is a 409 naming the session that holds it. A session's attachments end once its desktop is
destroyed (its disks unmounted), not when it is marked stopped, so that the next writer
never mounts a file system that is still mounted.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import re
import shutil
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from ..engines import VolumeAttach
from ..engines.volumes import create_disk
from ..errors import Conflict, Internal, NotFound, QuotaExceeded
from ..schemas.volumes import PROFILE_SIZE_MB, VolumeAttachment, VolumeCreate, VolumeMount
from .atomic_file import PARTIAL_SUFFIX, replace_file
from .lifecycle import utcnow

__all__ = ["VolumeRecord", "VolumeStore"]

log = logging.getLogger("deskbox.sessions")
_RECORD = "volume.json"
_DISK = "disk.ext4"
_OWNER = re.compile(r"^key_[0-9a-f]{16}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")  # schemas.volumes.VolumeName


class VolumeRecord(BaseModel):
    name: str
    owner: str
    size_mb: int
    created_at: datetime


class VolumeStore:
    def __init__(self, root: Path, quota_mb: int) -> None:
        self.root = root
        self._quota_mb = quota_mb
        # (owner, name) -> {session id: read-only}
        self._attached: dict[tuple[str, str], dict[str, bool]] = {}
        self._lock = asyncio.Lock()  # creates and deletes, one at a time

    def open(self) -> None:
        """Make the root (mode 0700) and remove volumes that never finished, and what saves
    of a record a killed server left."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for owner in self.root.iterdir():
            for entry in owner.iterdir() if owner.is_dir() else ():
                if entry.is_dir() and not (entry / _RECORD).is_file():
                    log.warning("removing the unfinished volume %s/%s", owner.name, entry.name)
                    shutil.rmtree(entry, ignore_errors=True)
                elif entry.is_dir():
                    for partial in entry.glob(f"{_RECORD}.*{PARTIAL_SUFFIX}"):  # a killed save's
                        partial.unlink(missing_ok=True)

    def _directory(self, owner: str, name: str) -> Path:
        assert _OWNER.match(owner) and _NAME.match(name), name
        return self.root / owner / name

    # -- the records ----------------------------------------------------------------------

    def _read(self, owner: str, name: str) -> VolumeRecord | None:
        """The volume's record; None for no volume. A record that cannot be read is not
        "no volume": a create or a profile's first use would then make the volume anew,
        removing its disk image."""
        directory = self._directory(owner, name)
        try:
            text = (directory / _RECORD).read_text()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise Internal(f"volume {name!r}: its record cannot be read ({error}); its "
                           "disk is kept") from None
        try:
            return VolumeRecord.model_validate_json(text)
        except ValidationError as error:
            return _rebuilt(directory, owner, name, error)

    def get(self, owner: str, name: str) -> VolumeRecord:
        record = self._read(owner, name) if _NAME.match(name) else None
        if record is None:
            raise NotFound(f"no volume {name!r}")
        return record

    def list(self, owner: str) -> list[VolumeRecord]:
        directory = self.root / owner
        names = sorted(p.name for p in directory.iterdir()
                       if _NAME.match(p.name)) if directory.is_dir() else []
        return [r for r in (self._read(owner, n) for n in names) if r is not None]

    def used_bytes(self, record: VolumeRecord) -> int:
        """What the sparse image takes on the host's disk."""
        try:
            return (self._directory(record.owner, record.name) / _DISK).stat().st_blocks * 512
        except FileNotFoundError:
            return 0

    def attachments(self, record: VolumeRecord) -> builtins.list[VolumeAttachment]:
        held = self._attached.get((record.owner, record.name), {})
        return [VolumeAttachment(session_id=s, read_only=ro) for s, ro in sorted(held.items())]

    async def create(self, owner: str, body: VolumeCreate) -> VolumeRecord:
        async with self._lock:
            return await self._create(owner, body.name, body.size_mb)

    async def _create(self, owner: str, name: str, size_mb: int) -> VolumeRecord:
        if await asyncio.to_thread(self._read, owner, name) is not None:
            raise Conflict(f"a volume {name!r} exists already")
        used = sum(r.size_mb for r in await asyncio.to_thread(self.list, owner))
        if used + size_mb > self._quota_mb:
            raise QuotaExceeded(f"this API key's volumes may hold {self._quota_mb} MB in all "
                                f"({used} MB taken); delete one first")
        record = VolumeRecord(name=name, owner=owner, size_mb=size_mb, created_at=utcnow())
        # All of it on a worker thread, which finishes (or cleans up) even if the request
        # is cancelled meanwhile: an unfinished volume's leftovers can take a while to go.
        await asyncio.to_thread(_make, self._directory(owner, name), record)
        log.info("volume %s/%s made (%d MB)", owner, name, size_mb)
        return record

    async def delete(self, owner: str, name: str) -> None:
        async with self._lock:
            record = await asyncio.to_thread(self.get, owner, name)
            held = self._attached.get((owner, name))
            if held:
                raise Conflict(f"volume {name!r} is attached to session "
                               f"{', '.join(sorted(held))}; delete or stop it first")
            await asyncio.to_thread(_remove, self._directory(owner, record.name))

    # -- attachments ----------------------------------------------------------------------

    async def attach(self, owner: str, session_id: str, mounts: Iterable[VolumeMount],
                     profiles: Iterable[str] = ()) -> tuple[VolumeAttach, ...]:
        """Attach a session's volumes (all or none): NotFound for a volume the key does not
        have, Conflict for one another session holds in a way this attach would break.
        ``profiles``: volumes made on first use (a browser profile's)."""
        mounts = list(mounts)
        async with self._lock:
            for name in profiles:
                if await asyncio.to_thread(self._read, owner, name) is None:
                    await self._create(owner, name, PROFILE_SIZE_MB)
            records = [await asyncio.to_thread(self.get, owner, m.name) for m in mounts]
            # No await from the checks to the registration: no other attach slips between.
            for mount in mounts:
                held = self._attached.get((owner, mount.name), {})
                writers = [s for s, read_only in held.items() if not read_only]
                if writers or (held and not mount.read_only):
                    holder = (writers or sorted(held))[0]
                    mode = "writable" if writers else "read-only"
                    raise Conflict(
                        f"volume {mount.name!r} is attached {mode} to session {holder}: a "
                        "volume has one writer, or readers only"
                    )
            self._register(owner, session_id, mounts)
        return tuple(
            VolumeAttach(m.name, self._directory(owner, r.name) / _DISK, m.path, m.read_only,
                         key=f"{owner}/{r.name}", size_mb=r.size_mb)
            for m, r in zip(mounts, records, strict=True)
        )

    def reattach(self, owner: str, session_id: str, mounts: Iterable[VolumeMount]) -> None:
        """A re-adopted session's attachments, as they were (a restarted server)."""
        self._register(owner, session_id, mounts)

    def _register(self, owner: str, session_id: str, mounts: Iterable[VolumeMount]) -> None:
        for mount in mounts:
            self._attached.setdefault((owner, mount.name), {})[session_id] = mount.read_only

    def detach(self, session_id: str) -> None:
        """The session's desktop is gone (its disks unmounted): its volumes are free."""
        for key, held in list(self._attached.items()):
            if held.pop(session_id, None) is not None and not held:
                del self._attached[key]


def _remove(directory: Path) -> None:
    """The record first: the volume is gone at once, whatever stops the rest (a killed
    server, a failing disk), and what is left is an unfinished volume that open() removes.
    Removed in the directory's order, the disk image could go first and a volume that
    could not be mounted come back, still counted against the key's quota."""
    (directory / _RECORD).unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)


def _rebuilt(directory: Path, owner: str, name: str, damage: ValidationError
             ) -> VolumeRecord | None:
    """A volume whose record is damaged (empty, cut short: a power loss before its write
    reached the disk) but whose disk image is there: its record made again from the image
    (the size it was made with, its time), so that the disk is neither lost nor left out of
    the key's quota. Without an image, an unfinished volume (None)."""
    try:
        made = (directory / _DISK).stat()
    except FileNotFoundError:
        log.warning("volume %s/%s has a damaged record and no disk: unfinished", owner, name)
        return None
    except OSError as error:
        raise Internal(f"volume {name!r}: its record is damaged and its disk cannot be "
                       f"looked at ({error})") from None
    record = VolumeRecord(name=name, owner=owner, size_mb=max(1, made.st_size >> 20),
                          created_at=datetime.fromtimestamp(made.st_mtime, UTC))
    log.warning("volume %s/%s: its record was damaged (%s); made again from its disk "
                "image (%d MB)", owner, name, damage.errors()[0]["msg"], record.size_mb)
    try:
        _write_record(directory, record)
    except OSError as error:  # kept in memory only: the next read makes it again
        log.warning("volume %s/%s: its record could not be written again: %s", owner, name,
                    error)
    return record


def _write_record(directory: Path, record: VolumeRecord) -> None:
    """Written whole or not at all, and on the disk before it counts (a power loss must
    not leave an empty record: see _rebuilt)."""
    replace_file(directory / _RECORD, record.model_dump_json().encode())


def _make(directory: Path, record: VolumeRecord) -> None:
    """The volume's directory, its disk image and then its record (which makes it exist);
    nothing of it is left if that fails."""
    directory.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.rmtree(directory, ignore_errors=True)  # an unfinished one of the same name
    directory.mkdir(mode=0o700)
    try:
        create_disk(directory / _DISK, record.size_mb)
        _write_record(directory, record)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
