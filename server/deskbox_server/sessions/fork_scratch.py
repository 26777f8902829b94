"""Where a fork's checkpoint goes: in the server's scratch directory (scratch.py: a tmpfs,
``/dev/shm`` by default) while it has room for the session's whole memory limit, else under
the state dir (``<state>/snapshots/.forks/``, which the snapshot store clears at start)."""

from __future__ import annotations

import secrets
from pathlib import Path

from ..scratch import Scratch

__all__ = ["ForkDirectories"]


class ForkDirectories:
    """New directories (not yet made) for forks' checkpoints, in memory where there is room."""

    def __init__(self, on_disk: Path, scratch: Path | None, state_dir: Path) -> None:
        self._on_disk = on_disk
        self._scratch = Scratch(scratch, state_dir, "fork")

    def open(self, forks: bool) -> None:
        """Clear what a killed server left; make the scratch directory if this server's
        engines can fork (``forks``)."""
        self._scratch.open(needed=forks)

    def new(self, room_bytes: int) -> Path:
        """A directory for one fork's checkpoint, of at most ``room_bytes``."""
        name = secrets.token_hex(8)
        private = self._scratch.room(room_bytes)
        if private is not None:
            return private / name
        self._on_disk.mkdir(mode=0o700, exist_ok=True)
        return self._on_disk / name

    def close(self) -> None:
        self._scratch.close()
