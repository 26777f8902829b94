"""Snapshots of a running sandbox, and new sandboxes restored from them (forks).

A snapshot is a directory (mode 0700) the session layer chooses::

    sandbox.json        the dumped sandbox's OCI config and inner display (oci.SandboxTemplate)
    images.tar.zst      CRIU's images (archive.py, mode 0600), for a snapshot that is kept
    images/             or the raw images, for a fork that restores them right away (and
                        beside the archive while a pool keeps copies: keep_unpacked)

The images hold the session's memory: every file is mode 0600 in a 0700 directory.

:func:`take_snapshot` dumps with ``--leave-running``: the sandbox goes on where it was.
:func:`restore_copy` makes a new sandbox (own container, cgroup, socket directory, display
number on the host, pid and network namespaces) running a copy of the dumped processes. Any
number of copies can be restored from one snapshot, also at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointUnavailable, SessionFailed
from ..base import StartTogether
from .archive import pack, unpack
from .criu import Criu, dump, restore_from, scratch_dirs, share_images
from .layout import Limits, SandboxTemplate, host_root_gid
from .sandbox import RuncOptions, RuncSandbox

__all__ = [
    "ARCHIVE", "RAW_IMAGES", "TEMPLATE", "SnapshotStats", "keep_unpacked", "read_template",
    "restore_copy", "snapshot_size", "take_snapshot",
]

TEMPLATE = "sandbox.json"
ARCHIVE = "images.tar.zst"
RAW_IMAGES = "images"


@dataclass(frozen=True)
class SnapshotStats:
    seconds: float
    raw_bytes: int
    compressed_bytes: int | None  # None for raw images (a fork's)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text)


def take_snapshot(
    sandbox: RuncSandbox, criu: Criu, directory: Path, packed: bool
) -> SnapshotStats:
    """Checkpoint the running sandbox into the new ``directory``; it keeps running.

    ``packed``: compress the images (a snapshot to keep) or leave them raw (a fork that
    restores them at once). Nothing outside the sandbox may hold a connection into it.
    On failure ``directory`` is removed and CheckpointUnavailable says why.
    """
    assert sandbox.display is not None
    template = SandboxTemplate.of_bundle(
        sandbox.bundle, sandbox.inner_display, sandbox.xserver_pid
    )
    if template.network_namespace is not None:
        raise CheckpointUnavailable(
            "snapshots and forks are available for sessions with network egress \"none\" "
            "only: a copy cannot take over the host-side network of this one"
        )
    directory.mkdir(mode=0o700)
    try:
        started = time.monotonic()
        compressed = None
        if packed:  # the raw images live until packed: in the scratch directory if it has room
            scratch, images, logs = scratch_dirs(sandbox, directory, "dump-")
            try:
                raw = dump(sandbox, criu, images, logs, leave_running=True)
                compressed = pack(images, directory / ARCHIVE)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        else:  # a fork's: its directory was chosen for images that live for moments
            images = directory / RAW_IMAGES
            images.mkdir(mode=0o700)
            logs = Path(tempfile.mkdtemp(prefix="dump-", dir=directory))
            raw = dump(sandbox, criu, images, logs, leave_running=True)
            shutil.rmtree(logs)
            gid = host_root_gid(template.config)
            if gid is not None:  # once here, not in each of the copies restored at once
                share_images(images, gid)
        _write_private(directory / TEMPLATE, template.to_json())
        return SnapshotStats(time.monotonic() - started, raw, compressed)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def read_template(directory: Path) -> SandboxTemplate:
    """The snapshot's template; SessionFailed if it is missing or not one."""
    try:
        return SandboxTemplate.from_json((directory / TEMPLATE).read_text())
    except FileNotFoundError:
        raise SessionFailed(f"the snapshot in {directory} is missing its {TEMPLATE}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise SessionFailed(f"the snapshot in {directory} is corrupted: {error}") from None


def restore_copy(
    options: RuncOptions,
    session_id: str,
    directory: Path,
    criu: Criu,
    limits: Limits | None = None,
    timeout_s: float = 30.0,
    together: StartTogether | None = None,
) -> RuncSandbox:
    """A new sandbox for ``session_id`` running a copy of the snapshot in ``directory``
    (let go with the other copies of its fork: ``together``).

    SessionFailed naming the cause (a missing or corrupted snapshot, a session image that
    is gone, CRIU's error) leaves nothing of the new sandbox behind.
    """
    template = read_template(directory)
    if not template.rootfs.is_dir():
        raise SessionFailed(
            f"the session image the snapshot was taken on ({template.rootfs}) is gone"
        )
    raw = directory / RAW_IMAGES
    archive = directory / ARCHIVE
    if not raw.is_dir() and not archive.is_file():
        raise SessionFailed(f"the snapshot in {directory} has no images")

    def run_restore(sandbox: RuncSandbox) -> None:
        restore_from(sandbox, criu, archive, raw if raw.is_dir() else None, together)

    return RuncSandbox.restore_copy(
        options, session_id, template, run_restore, limits, timeout_s
    )


def keep_unpacked(directory: Path) -> None:
    """Unpack a kept snapshot's images beside its archive, once: its restores then skip the
    decompression (0.3-0.9 s of a restore's 1-1.5 s here; bench/rl.py). Unpacked into a
    scratch directory first and renamed, so a restore never finds half of them."""
    raw, archive = directory / RAW_IMAGES, directory / ARCHIVE
    if raw.is_dir() or not archive.is_file():
        return
    scratch = Path(tempfile.mkdtemp(prefix="images-", dir=directory))
    try:
        unpack(archive, scratch)
        try:
            os.rename(scratch, raw)
        except OSError:
            if not raw.is_dir():
                raise
            # another call unpacked it meanwhile
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def snapshot_size(directory: Path) -> int:
    """Bytes the snapshot takes on disk."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())

