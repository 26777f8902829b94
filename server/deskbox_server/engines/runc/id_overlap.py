"""Whether another user of the host may become the sandboxes' ids.

Sandboxes with a user namespace run as the host's ``SANDBOX_USER_IDS`` (layout.py). A
user that ``/etc/subuid`` or ``/etc/subgid`` grants a range overlapping them can make a
user namespace of its own (newuidmap) and be those ids: it could then reach every
session's agent socket and signal its processes. Debian's ``useradd`` gives the first
ordinary user 100000-165535, which were the sandboxes' ids before 0x7FF00000-0x7FF0FFFF.

A checkpoint keeps the ids it was taken with: CRIU restores the user namespace it dumped,
whatever the config says. Its copies (and a hibernated sandbox, resumed) run as those ids,
and the host side made for them must let those ids in (:func:`checkpoint_root_gid`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from .layout import RuntimeConfig, host_root_gid

__all__ = ["checkpoint_root_gid", "users_sharing_ids"]

log = logging.getLogger("deskbox.runc")


def users_sharing_ids(ids: tuple[int, int], files: tuple[Path, ...] = (
        Path("/etc/subuid"), Path("/etc/subgid"))) -> list[str]:
    """Each ``user (file: start-end)`` whose subordinate range overlaps ``ids`` (first,
    count)."""
    first, count = ids
    found = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            fields = line.strip().split(":")
            if len(fields) != 3 or not (fields[1].isdigit() and fields[2].isdigit()):
                continue
            start, length = int(fields[1]), int(fields[2])
            if start < first + count and first < start + length:
                found.append(f"{fields[0]} ({path}: {start}-{start + length - 1})")
    return found


def checkpoint_root_gid(current: tuple[int, int] | None, config: RuntimeConfig) -> int | None:
    """The host gid the root of a sandbox restored with ``config`` (a checkpoint's) runs as:
    the one it was checkpointed with. A warning where that is not today's range
    (``current``), naming any user of the host that may become those ids."""
    gid = host_root_gid(config)
    if gid is None or current is None or gid == current[0]:
        return gid
    sharing = users_sharing_ids((gid, current[1]))
    log.warning(
        "restoring a checkpoint taken while the sandboxes ran as the host's ids %d-%d "
        "(today %d-%d): its processes keep them%s; snapshots of new sessions have today's",
        gid, gid + current[1] - 1, current[0], current[0] + current[1] - 1,
        f", and {', '.join(sharing)} may become them" if sharing else "")
    return gid
