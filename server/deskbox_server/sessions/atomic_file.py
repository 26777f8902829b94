"""A small file replaced whole: its new content written under a name of its own next to it,
then renamed over it.

Each write has its own temporary name: two writers of the same record at once (two pool
sizes set together, two secrets of one name) once shared one fixed ``.partial`` name,
so one's shorter bytes landed in the other's file, which was then renamed into place
cut, and the second rename found nothing (a 500).

The content reaches the disk before the rename, and the rename before the call returns: a
power loss otherwise can leave the new name with no content (an empty snapshot record
hides the snapshot, its disk use uncounted, for good).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["PARTIAL_SUFFIX", "replace_file"]

PARTIAL_SUFFIX = ".partial"  # what a killed writer leaves; the stores' open() removes them


def replace_file(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` (mode 0600), or what it held before: never a mix."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.",
                                   suffix=PARTIAL_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with contextlib.suppress(OSError):  # the file is replaced all the same
                os.fsync(directory)
        finally:
            os.close(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
