"""A small file replaced whole: its new content written under a name of its own next to it,
then renamed over it.

Each write has its own temporary name: two writers of the same record at once (two pool
sizes set together, two secrets of one name) once shared one fixed ``.partial`` name,
so one's shorter bytes landed in the other's file, which was then renamed into place
cut, and the second rename found nothing (a 500).
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
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
        raise
