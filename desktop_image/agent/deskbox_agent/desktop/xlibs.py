"""The X client libraries mss loads, named without running a program.

mss (10.2) names each library with ``ctypes.util.find_library``, which on Linux runs
``/sbin/ldconfig -p`` (then gcc, then ld) per name: eight children at the agent's first
desktop call (three when mss is imported, five when its xcb bindings load), and when none
can start, as in a sandbox at its pids limit, find_library takes the failed fork for a
missing library and the desktop failed with "Library libxcb.so not found". mss takes no
path of its own, so while it is imported and its bindings load, find_library answers
these names with their sonames (what ldconfig would have found: dlopen then looks them up
in the loader's cache, no program run). A library truly missing then fails its dlopen,
naming its file.
"""

from __future__ import annotations

import contextlib
import ctypes.util
from collections.abc import Iterator

__all__ = ["sonames_known"]

# The image's (Debian 12's) and any glibc distribution's: these sonames are the libraries'
# ABI versions, unchanged for a decade and more.
SONAMES = {
    "xcb": "libxcb.so.1",
    "xcb-randr": "libxcb-randr.so.0",
    "xcb-render": "libxcb-render.so.0",
    "xcb-shm": "libxcb-shm.so.0",
    "xcb-xfixes": "libxcb-xfixes.so.0",
    "X11": "libX11.so.6",  # mss.linux.xlib's, named on import (its backend is not used)
    "Xfixes": "libXfixes.so.3",
    "Xrandr": "libXrandr.so.2",
}


@contextlib.contextmanager
def sonames_known() -> Iterator[None]:
    """``ctypes.util.find_library`` answers SONAMES' names at once inside the block."""
    original = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        return SONAMES.get(name) or original(name)

    ctypes.util.find_library = find_library
    try:
        yield
    finally:
        ctypes.util.find_library = original
