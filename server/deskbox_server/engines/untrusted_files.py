"""Reading a file that a sandbox (or a process it subverted) can write, as root.

Whatever is at the name may be a symbolic link to a host file, a FIFO that blocks its
reader, a device, or a file that never ends: none of it is followed or waited on, and only
a bounded part of a regular file is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["read_regular"]


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes:
    """At most ``limit`` bytes of ``path`` (its first, or with ``tail`` its last) if it is
    a regular file; else nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return b""
        return os.pread(fd, limit, max(0, found.st_size - limit) if tail else 0)
    except OSError:
        return b""
    finally:
        os.close(fd)
