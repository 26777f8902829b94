"""A runc sandbox's persistent volumes: their disks mounted on the host, bound into it.

Each volume's ext4 image is loop-mounted at ``<shared dir>/volumes/<n>`` (the sandbox's
small host tmpfs, which only its own gid may enter) and its config binds that directory
where the session asked. The list is kept in the session directory (``volumes.json``), so
that a hibernated sandbox taken over by the next server gets its disks mounted again.

A disk is unmounted, not detached lazily, once the sandbox's processes are gone: the
unmount writes the file system out, and the next session may mount the same image for
writing only after that.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import time
from pathlib import Path

from ...errors import SessionFailed
from ..base import VolumeAttach
from ..volumes import mount_disk, reown
from .displays import unmount

__all__ = ["VOLUMES_FILE", "mount_volumes", "remount_volumes", "unmount_volumes"]

VOLUMES_FILE = "volumes.json"
_UNMOUNT_WAIT_S = 5.0
_libc = ctypes.CDLL(None, use_errno=True)
_UMOUNT_NOFOLLOW = 8


def _targets(shared_dir: Path) -> Path:
    return shared_dir / "volumes"


def mount_volumes(
    shared_dir: Path, session_dir: Path, volumes: tuple[VolumeAttach, ...],
    root_ids: tuple[int, int],
) -> tuple[tuple[str, Path, bool], ...]:
    """Mount the disks; the config's binds (destination, source, read-only).

    ``root_ids``: the host uid and gid of the sandbox's root, who gets a writable volume's
    files (volumes.reown). On failure what was mounted is unmounted again.
    """
    if not volumes:
        return ()
    (session_dir / VOLUMES_FILE).write_text(json.dumps(
        [{"disk": str(v.disk), "path": v.path, "read_only": v.read_only} for v in volumes]))
    return _mount_all(shared_dir, volumes, root_ids)


def remount_volumes(shared_dir: Path, session_dir: Path, root_ids: tuple[int, int]) -> None:
    """Mount a checkpointed sandbox's disks again (its host side was made anew)."""
    try:
        entries = json.loads((session_dir / VOLUMES_FILE).read_text())
    except FileNotFoundError:
        return
    volumes = tuple(VolumeAttach(Path(e["disk"]).parent.name, Path(e["disk"]), e["path"],
                                 bool(e["read_only"])) for e in entries)
    _mount_all(shared_dir, volumes, root_ids)


def _mount_all(shared_dir: Path, volumes: tuple[VolumeAttach, ...],
               root_ids: tuple[int, int]) -> tuple[tuple[str, Path, bool], ...]:
    targets = _targets(shared_dir)
    targets.mkdir(mode=0o710, exist_ok=True)
    os.chown(targets, 0, root_ids[1])  # the sandbox's gid enters it, as its shared dir
    binds = []
    try:
        for n, volume in enumerate(volumes):
            target = targets / str(n)
            target.mkdir(mode=0o700, exist_ok=True)
            mount_disk(volume.disk, target, volume.read_only)
            if not volume.read_only:
                reown(target, *root_ids)
            binds.append((volume.path, target, volume.read_only))
    except BaseException:
        unmount_volumes(shared_dir)
        raise
    return tuple(binds)


def unmount_volumes(shared_dir: Path) -> None:
    """Unmount every disk of the sandbox (its processes are gone); SessionFailed naming
    one still busy after a few seconds (then it is detached lazily, and stays mounted
    until its last user ends)."""
    targets = _targets(shared_dir)
    if not targets.is_dir():
        return
    busy = []
    for target in sorted(targets.iterdir()):
        if not _unmount(target):
            busy.append(target.name)
    if busy:
        raise SessionFailed(f"volume mounts {', '.join(busy)} of {shared_dir.name} stayed busy")


def _unmount(target: Path) -> bool:
    deadline = time.monotonic() + _UNMOUNT_WAIT_S
    while True:
        if _libc.umount2(os.fsencode(target), _UMOUNT_NOFOLLOW) == 0:
            continue  # mounted more than once: take them all off
        error = ctypes.get_errno()
        if error in (errno.EINVAL, errno.ENOENT):  # nothing (more) mounted there
            return True
        if error != errno.EBUSY or time.monotonic() > deadline:
            unmount(target)  # detached lazily: gone once its last user is
            return False
        time.sleep(0.05)
