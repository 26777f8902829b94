"""What pausing a session needs besides the state machine: quiet, a last frame, its image.

A session is paused in this order (state_changes.py): its state becomes ``paused`` first,
so no new action, exec or file transfer reaches the desktop (409 ``conflict``);
the work already in flight is let finish (:func:`drain`); the screen is grabbed once, on
the desktop's worker, as the *last frame*; only then is the sandbox frozen. While frozen
nothing makes an X call (a frozen X server answers nothing), and ``GET /screenshot`` is
answered from the last frame (:func:`frozen_image`) with ``X-Deskbox-Frozen: true``.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import NO_ROOM, Conflict, InsufficientStorage
from ..media import EncodedImage, Frame, encode
from ..schemas import actions as a

__all__ = [
    "DRAIN_TIMEOUT_S", "FROZEN_HEADER", "FrameStore", "LastFrame", "drain", "frozen_image",
]

FROZEN_HEADER = "X-Deskbox-Frozen"
# How long pause waits for actions and commands in flight before it answers 409.
DRAIN_TIMEOUT_S = 10.0
_DRAIN_POLL_S = 0.005


@dataclass(frozen=True)
class LastFrame:
    """The screen of a paused session as it was when it was paused."""

    frame: Frame
    at: datetime


async def drain(busy: Callable[[], int], session_id: str, timeout_s: float) -> None:
    """Wait until nothing is in flight on the session (``busy()`` is 0), or Conflict."""
    deadline = time.monotonic() + timeout_s
    while busy() > 0:
        if time.monotonic() > deadline:
            raise Conflict(
                f"session {session_id} is busy ({busy()} actions or commands still running "
                f"after {timeout_s:g} s); try pausing it again once they are done"
            )
        await asyncio.sleep(_DRAIN_POLL_S)


def frozen_image(
    last: LastFrame,
    fmt: Literal["jpeg", "png", "webp"],
    quality: int,
    view: a.CoordinateSpace | None = None,
    scale: a.ScaleTo | None = None,
) -> EncodedImage:
    """The last frame encoded as a screenshot of the live screen would have been."""
    frame = last.frame
    width, height = frame.width, frame.height
    if view is not None:
        width, height = view.width, view.height
    if scale is not None:
        width, height = scale.width, scale.height
    return encode(frame.scaled(width, height), fmt, quality)


_SESSION_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class FrameStore:
    """Last frames of hibernated sessions on disk (``<state>/frames/<id>.npy``, mode 0600),
    so that a server that restarts still answers their screenshots until they resume."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for partial in self.root.glob("*.partial"):  # a save a killed server left
            partial.unlink(missing_ok=True)

    def _path(self, session_id: str) -> Path:
        if not _SESSION_ID.match(session_id):
            raise ValueError(f"not a session id: {session_id!r}")
        return self.root / f"{session_id}.npy"

    def save(self, session_id: str, frame: Frame) -> None:
        path = self._path(session_id)
        partial = path.with_suffix(".partial")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                np.save(file, frame.pixels, allow_pickle=False)
            os.replace(partial, path)
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno in NO_ROOM:
                raise InsufficientStorage(
                    "no room on the server's disk for the session's last frame: "
                    f"{error.strerror}") from None
            raise

    def load(self, session_id: str) -> LastFrame | None:
        path = self._path(session_id)
        try:
            pixels = np.load(path, allow_pickle=False)
            at = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        except (OSError, ValueError):
            return None
        if pixels.ndim != 3 or pixels.shape[2] != 4 or pixels.dtype != np.uint8:
            return None
        return LastFrame(Frame(pixels), at)

    def forget(self, session_id: str) -> None:
        self._path(session_id).unlink(missing_ok=True)
