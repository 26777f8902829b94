"""Recordings on disk: one directory per recorded session, kept after the session until
it expires or is deleted, within a per-key quota.

    <state_dir>/recordings/<session id>/   (0700: frames show whatever was on screen)
        meta.json          the Recording resource, its owner and counters
        trajectory.jsonl   every entry as it happened (recorder.py writes them)
        frames/000000.jpg  the video's frames, each written when the screen changed
        shots/000007.jpeg  the settled screenshot a batch asked for, by the entry's seq
        video-<n>.mp4      made on request from the first n frames, kept if it fits the
                           key's quota (recording_media.py)

Blocking: call from a worker thread, except :meth:`meta`, :meth:`owned`, :meth:`used`
(in-memory). The live recorder only appends; the API reads.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import threading
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import Field

from ..errors import NO_ROOM, NotFound
from ..schemas.recordings import Recording
from .atomic_file import PARTIAL_SUFFIX, replace_file
from .lifecycle import utcnow
from .listing import Position

__all__ = ["VIDEOS", "VIDEO_PARTIAL", "RecordingMeta", "RecordingStore", "recording_position"]

log = logging.getLogger("deskbox.recordings")

# No room, and a file size limit too: the save is tried again later, never an error that
# stops what called it (a server whose writes meet a limit still starts, and saves once it
# is lifted).
_NOT_NOW = NO_ROOM | {errno.EFBIG}
VIDEOS = "video-*.mp4"  # the kept videos of a recording's directory
VIDEO_PARTIAL = "video.partial.mp4"  # the one being encoded


class RecordingMeta(Recording):
    owner: str
    entries: int = 0  # lines of trajectory.jsonl: the next entry's seq
    # The kept video's size (recording_media.py): counted against the key's quota, read
    # from the disk at open rather than saved.
    video_bytes: int = Field(0, exclude=True)


def recording_position(meta: RecordingMeta) -> Position:
    return meta.started_at, meta.session_id


class RecordingStore:
    def __init__(self, root: Path, ttl: timedelta) -> None:
        self.root = root
        self._ttl = ttl
        self._metas: dict[str, RecordingMeta] = {}
        self._lock = threading.Lock()  # the table, between the loop and worker threads
        # Recordings whose state in memory a full disk kept from meta.json: the truth
        # until a sweep saves them (one left `recording` there would be stopped again by
        # the next server's open, its expiry pushed back).
        self._unsaved: set[str] = set()

    # -- the table ------------------------------------------------------------------------

    def open(self) -> None:
        """Load what a previous server left; one that was recording then is stopped now
        (its session is not followed across a restart), the expired ones go."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for directory in sorted(self.root.iterdir()):
            for partial in directory.glob(f"meta.json.*{PARTIAL_SUFFIX}"):  # a killed save's
                partial.unlink(missing_ok=True)
            # A killed server's encode: counted nowhere, it held its disk until the next.
            (directory / VIDEO_PARTIAL).unlink(missing_ok=True)
            try:
                meta = RecordingMeta.model_validate_json((directory / "meta.json").read_text())
            except (OSError, ValueError):
                log.warning("recording %s: unreadable; removed", directory.name)
                shutil.rmtree(directory, ignore_errors=True)
                continue
            meta.video_bytes = sum(video.stat().st_size for video in directory.glob(VIDEOS))
            self._metas[meta.session_id] = meta
            if meta.state == "recording":
                # A full disk must not stop the server's start, nor keep the sweep below
                # from freeing the expired recordings.
                self.stopped(meta, "the server restarted")
                self.save_when_room(meta)
        self.sweep()

    def meta(self, session_id: str) -> RecordingMeta | None:
        return self._metas.get(session_id)

    def owned(self, owner: str, session_id: str) -> RecordingMeta:
        meta = self._metas.get(session_id)
        if meta is None or meta.owner != owner:
            raise NotFound(f"session {session_id} has no recording")
        return meta

    def page(
        self, owner: str, after: Position | None, limit: int
    ) -> tuple[list[RecordingMeta], bool]:
        """``owner``'s recordings after ``after``, newest first (by start, then session id):
        at most ``limit``, and whether more follow."""
        with self._lock:
            mine = [m for m in self._metas.values()
                    if m.owner == owner and (after is None or recording_position(m) < after)]
        mine.sort(key=recording_position, reverse=True)
        return mine[:limit], len(mine) > limit

    def used(self, owner: str) -> int:
        """Bytes of ``owner``'s recordings on disk (frames, shots, trajectories, videos)."""
        with self._lock:
            return sum(m.bytes + m.video_bytes for m in self._metas.values()
                       if m.owner == owner)

    # -- one recording ---------------------------------------------------------------------

    def directory(self, session_id: str) -> Path:
        return self.root / session_id

    def begin(self, owner: str, session_id: str) -> RecordingMeta:
        """A new recording of the session, or its stopped one going on (appended to)."""
        meta = self._metas.get(session_id)
        if meta is None:
            meta = RecordingMeta(session_id=session_id, owner=owner, state="recording",
                                 started_at=utcnow(), frames=0, actions=0, bytes=0)
            directory = self.directory(session_id)
            directory.mkdir(mode=0o700, exist_ok=True)
            (directory / "frames").mkdir(mode=0o700, exist_ok=True)
            (directory / "shots").mkdir(mode=0o700, exist_ok=True)
        else:
            meta.state, meta.stopped_at, meta.stop_reason, meta.expires_at = (
                "recording", None, None, None)
        self.save(meta)
        with self._lock:
            self._metas[session_id] = meta
            self._unsaved.discard(session_id)
        return meta

    def stopped(self, meta: RecordingMeta, reason: str | None) -> None:
        """Mark it stopped (in memory; :meth:`save` writes it): it expires from now."""
        now = utcnow()
        meta.state, meta.stopped_at, meta.stop_reason = "stopped", now, reason
        meta.expires_at = now + self._ttl

    def append(self, meta: RecordingMeta, lines: list[bytes],
               files: list[tuple[str, bytes]]) -> int:
        """Write files (relative to the recording) and trajectory lines; bytes written."""
        directory = self.directory(meta.session_id)
        written = 0
        for name, data in files:
            (directory / name).write_bytes(data)
            written += len(data)
        if lines:
            data = b"".join(lines)
            with open(directory / "trajectory.jsonl", "ab") as trajectory:
                trajectory.write(data)
            written += len(data)
        return written

    def save(self, meta: RecordingMeta) -> None:
        # Each save under a name of its own: a recorder's flush and its stop save at once,
        # and two sharing one fixed name met a FileNotFoundError (a 500).
        replace_file(self.directory(meta.session_id) / "meta.json",
                     meta.model_dump_json().encode())

    def save_when_room(self, meta: RecordingMeta) -> None:
        """:meth:`save`; on a full disk, later (a :meth:`sweep`), its state in memory
        meanwhile. Other errors are raised."""
        try:
            self.save(meta)
        except OSError as error:
            if error.errno not in _NOT_NOW:
                raise
            log.error("recording of session %s: its %s state is not saved yet: %s",
                      meta.session_id, meta.state, error)
            with self._lock:
                self._unsaved.add(meta.session_id)
        else:
            with self._lock:
                self._unsaved.discard(meta.session_id)

    def delete(self, owner: str, session_id: str) -> None:
        self.owned(owner, session_id)
        with self._lock:
            self._metas.pop(session_id, None)
            self._unsaved.discard(session_id)
        shutil.rmtree(self.directory(session_id), ignore_errors=True)

    def sweep(self, now: datetime | None = None) -> list[str]:
        """Delete the recordings past their expiry; their session ids. Then save what a
        full disk kept from being saved, as far as there is room now."""
        now = now or utcnow()
        with self._lock:
            expired = [m.session_id for m in self._metas.values()
                       if m.expires_at is not None and m.expires_at <= now]
            for session_id in expired:
                self._metas.pop(session_id, None)
                self._unsaved.discard(session_id)
        for session_id in expired:
            with contextlib.suppress(OSError):
                shutil.rmtree(self.directory(session_id))
            log.info("recording of session %s expired; deleted", session_id)
        self._save_unsaved()
        return expired

    def _save_unsaved(self) -> None:
        with self._lock:
            unsaved = [self._metas[s] for s in self._unsaved if s in self._metas]
        for meta in unsaved:
            try:
                self.save(meta)
            except OSError as error:
                if error.errno in _NOT_NOW:
                    return  # still full: the next sweep tries again
                if not isinstance(error, FileNotFoundError):  # not deleted meanwhile
                    raise
            else:
                log.info("recording of session %s: its %s state saved", meta.session_id,
                         meta.state)
            with self._lock:
                self._unsaved.discard(meta.session_id)
