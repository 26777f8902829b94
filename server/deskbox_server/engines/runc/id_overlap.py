"""Whether another user of the host may become the sandboxes' ids.

Sandboxes with a user namespace run as the host's ``SANDBOX_USER_IDS`` (layout.py). A
user that ``/etc/subuid`` or ``/etc/subgid`` grants a range overlapping them can make a
user namespace of its own (newuidmap) and be those ids: it could then reach every
session's agent socket and signal its processes. Debian's ``useradd`` gives the first
ordinary user 100000-165535, which is that range.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["users_sharing_ids"]


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
