"""A server's private directory in a tmpfs, for checkpoint images that live for moments.

A fork's checkpoint lives until its copies run, a snapshot's or a hibernation's raw images
until they are packed, an archive's until CRIU has restored them: about a second each. On
the disk each of those ~200 MB is allocated, journalled and queued for writeback, which
competes with the restores for the CPU; in memory none of that happens (a fork's dump 432
→ 343 ms here, bench/README.md). ``DESKBOX_SCRATCH_DIR`` (default ``/dev/shm``) names the
tmpfs; a caller uses the private directory only while it has room for the images (else it
writes beside them on the disk, as without one).

The directory is made afresh at each start by ``mkdtemp`` (mode 0700, a name no other user
can claim first), named after the state dir and its purpose. One that a killed server left
is removed by the next start on the same state dir, and only if this user owns it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

__all__ = ["Scratch", "scratch_prefix"]

log = logging.getLogger("deskbox.scratch")


class Scratch:
    """This server's scratch directory for one ``purpose`` ("fork", "images")."""

    def __init__(self, base: Path | None, state_dir: Path, purpose: str) -> None:
        self._base = base
        self._prefix = scratch_prefix(state_dir, purpose)
        self._private: Path | None = None

    def open(self, needed: bool = True) -> None:
        """Remove what a killed server of this state dir left, then make this server's
        own directory if it is ``needed`` (or do without: callers then write to the disk)."""
        if self._base is None:
            return
        try:
            for entry in self._base.iterdir():
                if entry.name.startswith(self._prefix) and _own_directory(entry):
                    log.info("removing the scratch directory %s a previous server left", entry)
                    shutil.rmtree(entry, ignore_errors=True)
            if needed:
                self._private = Path(tempfile.mkdtemp(prefix=self._prefix, dir=self._base))
        except OSError as error:
            log.warning("checkpoint images go to the disk: no scratch directory in %s (%s)",
                        self._base, error)

    def room(self, needed: int) -> Path | None:
        """The private directory if it has ``needed`` bytes free; None if not."""
        if self._private is None:
            return None
        try:
            return self._private if shutil.disk_usage(self._private).free >= needed else None
        except OSError as error:
            log.warning("the scratch directory %s: %s", self._private, error)
            return None

    def close(self) -> None:
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None


def scratch_prefix(state_dir: Path, purpose: str) -> str:
    """The start of the scratch directory's name of the server of ``state_dir``."""
    digest = hashlib.sha256(os.fsencode(state_dir.resolve())).hexdigest()[:12]
    return f"deskbox-{purpose}-{digest}-"


def _own_directory(path: Path) -> bool:
    """A directory (not a link to one) that this process's user owns."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()
