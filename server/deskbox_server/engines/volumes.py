"""Persistent volumes as disk images: one sparse ext4 file per volume.

A file system of its own gives a volume a hard size (a full volume is ENOSPC for the
program that writes, and nothing else), survives any session, and is what a VM would get as
a virtio-blk disk. The runc engine loop-mounts it on the host and binds it into the sandbox
(:func:`mount_disk`); the image is never mounted twice for writing (the session layer lets a
volume have one writer, or readers only).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..errors import Internal, SessionFailed

__all__ = ["create_disk", "mount_disk", "reown"]

_TIMEOUT_S = 60


def _run(argv: list[str], what: str, error: type[Exception]) -> None:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise error(f"{what}: {argv[0]} is not installed (e2fsprogs, util-linux)") from None
    except subprocess.TimeoutExpired:
        raise error(f"{what}: {argv[0]} did not finish in {_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise error(f"{what}: {(done.stderr or done.stdout).strip()[-500:]}")


def create_disk(path: Path, size_mb: int) -> None:
    """A new empty ext4 image of ``size_mb`` at ``path`` (sparse: it takes what is written).

    No blocks reserved for root (a sandbox's root is the volume's only user) and no lazy
    initialisation left to a first mount.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size_mb * 1024 * 1024)
    finally:
        os.close(fd)
    try:
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E",
              "lazy_itable_init=0,lazy_journal_init=0", str(path)],
             "could not make the volume's file system", Internal)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def mount_disk(disk: Path, target: Path, read_only: bool) -> None:
    """Loop-mount ``disk`` on ``target`` (nosuid, nodev). Read-only mounts replay no journal
    (``noload``): they may share the image, and none of them may write to it."""
    options = "loop,nosuid,nodev," + ("ro,noload" if read_only else "rw")
    _run(["mount", "-t", "ext4", "-o", options, str(disk), str(target)],
         f"could not mount the volume {disk.parent.name}", SessionFailed)


def reown(root: Path, uid: int, gid: int) -> None:
    """Give a writable volume's files to the sandbox's root (``uid``/``gid`` on the host).

    Sandboxes run as root in a user namespace (egress "none") or as the host's root without
    capabilities: either way they can write only what their own root owns, so a volume
    written by one kind of sandbox is handed over to the other. Only files of the previous
    owner move; nothing if it is the same (the usual case, a stat of the root).
    """
    stat = root.stat()
    old_uid, old_gid = stat.st_uid, stat.st_gid
    if (old_uid, old_gid) == (uid, gid):
        return
    # Neither os.walk nor lchown follows a symlink the sandbox left: nothing outside moves.
    for directory, names, files in os.walk(root):
        links = [name for name in names if os.path.islink(os.path.join(directory, name))]
        for path in (directory, *(os.path.join(directory, n) for n in (*files, *links))):
            st = os.lstat(path)
            new_uid = uid if st.st_uid == old_uid else -1
            new_gid = gid if st.st_gid == old_gid else -1
            if new_uid != -1 or new_gid != -1:
                os.lchown(path, new_uid, new_gid)
