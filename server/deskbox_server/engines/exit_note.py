"""Why a sandbox's init ended, in its own words.

The init (deskbox-session) writes one line to ``deskbox-exit`` in its socket directory as
it ends for a reason of its own (its X server died, the desktop could not start): its
logs go with the sandbox, and that directory is a host directory too (runc, docker). The
sandbox writes it, so it is read as hostile: no link followed, a regular file only, a few
hundred bytes at most, printable characters only.
"""

from __future__ import annotations

from pathlib import Path

from .untrusted_files import read_regular

__all__ = ["EXIT_NOTE", "exit_note"]

EXIT_NOTE = "deskbox-exit"
_LIMIT = 200


def exit_note(socket_dir: Path) -> str | None:
    """The init's line in ``socket_dir``, or None if it left none."""
    raw = read_regular(socket_dir / EXIT_NOTE, _LIMIT)
    text = "".join(c for c in raw.decode("utf-8", "replace") if c.isprintable()).strip()
    return text or None
