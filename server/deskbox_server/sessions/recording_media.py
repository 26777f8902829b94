"""What a recording is read as: its trajectory (JSON lines, each action with the frames
before and after it), its video (H.264 in MP4, encoded by PyAV's FFmpeg) and a zip export.
Blocking: run on a worker thread.

Frames were taken when the screen changed, so an action's frames are found by time:
``frame_before`` is the last frame taken at or before the action began; ``frame_after``
the first one taken after it ended and before the next action began, else (nothing
changed on screen) the last one at or before its end.
"""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import NotFound, SessionFailed, Timeout
from .recording_store import RecordingMeta, RecordingStore

__all__ = ["export_zip", "frame_path", "trajectory", "trajectory_lines", "video"]

_VIDEO_LOCK = threading.Lock()  # one encoding at a time: it takes a core while it runs
_ENCODE_TIMEOUT_S = 600


def _entries(store: RecordingStore, meta: RecordingMeta) -> list[dict[str, Any]]:
    path = store.directory(meta.session_id) / "trajectory.jsonl"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    entries = []
    for line in raw.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:  # a line cut short when the server was killed mid-write
            continue
    return entries


def trajectory(store: RecordingStore, meta: RecordingMeta) -> list[dict[str, Any]]:
    """Every entry in time order, actions with ``frame_before`` and ``frame_after``."""
    entries = sorted(_entries(store, meta), key=lambda e: (e["t"], e["seq"]))
    frames = [(e["t"], e["frame"]) for e in entries if e["kind"] == "frame"]
    times = [t for t, _ in frames]
    starts = [e["t"] for e in entries if e["kind"] == "action"]
    action_index = 0
    for entry in entries:
        if entry["kind"] != "action":
            continue
        action_index += 1
        next_start = starts[action_index] if action_index < len(starts) else None
        before = bisect.bisect_right(times, entry["t"]) - 1
        entry["frame_before"] = frames[before][1] if before >= 0 else None
        after = bisect.bisect_left(times, entry["end_t"])
        if after < len(times) and (next_start is None or times[after] < next_start):
            entry["frame_after"] = frames[after][1]
        else:
            unchanged = bisect.bisect_right(times, entry["end_t"]) - 1
            entry["frame_after"] = frames[unchanged][1] if unchanged >= 0 else None
    return entries


def trajectory_lines(entries: list[dict[str, Any]]) -> Iterator[bytes]:
    for entry in entries:
        yield json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def frame_path(store: RecordingStore, meta: RecordingMeta, number: int) -> Path:
    if not 0 <= number < meta.frames:
        raise NotFound(f"recording of session {meta.session_id} has no frame {number} "
                       f"(it has {meta.frames})")
    path = store.directory(meta.session_id) / "frames" / f"{number:06d}.jpg"
    if not path.is_file():  # the recording deleted (or expired) meanwhile
        raise NotFound(f"recording of session {meta.session_id} has no frame {number}")
    return path


def video(store: RecordingStore, meta: RecordingMeta) -> Path:
    """The video of the frames so far, made on first request and kept (made again once
    more frames came). Encoded by video_encode.py in a process of its own, which limits
    its memory and CPU time: the frames are a sandbox's JPEGs, hostile data to decode."""
    if meta.frames == 0 or meta.width is None or meta.height is None:
        raise NotFound(f"recording of session {meta.session_id} has no frame yet")
    directory = store.directory(meta.session_id)
    entries = _entries(store, meta)
    frames = [(e["t"], e["frame"]) for e in entries if e["kind"] == "frame"]
    if not frames:  # none written (the quota), or the recording deleted meanwhile
        raise NotFound(f"recording of session {meta.session_id} has no frame yet")
    # The last frame stays on screen until the last thing recorded.
    end = max(max(e["t"], e.get("end_t", 0)) for e in entries)
    target = directory / f"video-{len(frames)}.mp4"
    with _VIDEO_LOCK:
        if target.exists():
            return target
        for old in directory.glob("video-*.mp4"):
            old.unlink(missing_ok=True)
        partial = directory / "video.partial.mp4"
        job = {"out": str(partial), "width": meta.width, "height": meta.height, "frames": [
            [t, str(directory / "frames" / f"{number:06d}.jpg")]
            for t, number in [*frames, (end, frames[-1][1])]]}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "deskbox_server.sessions.video_encode"],
                input=json.dumps(job).encode(), capture_output=True, check=False,
                timeout=_ENCODE_TIMEOUT_S)
            if done.returncode != 0:
                reason = done.stderr.decode(errors="replace").strip().splitlines()
                raise SessionFailed("the recording's frames could not be encoded: "
                                    f"{reason[-1] if reason else f'exit {done.returncode}'}")
            os.replace(partial, target)
        except subprocess.TimeoutExpired:
            raise Timeout(f"encoding the video took over {_ENCODE_TIMEOUT_S:g} s") from None
        finally:
            partial.unlink(missing_ok=True)
    return target


def export_zip(store: RecordingStore, meta: RecordingMeta) -> Path:
    """A zip of the trajectory, the frames and the settled screenshots (a temporary file
    the caller removes once sent)."""
    directory = store.directory(meta.session_id)
    entries = trajectory(store, meta)
    handle, name = tempfile.mkstemp(dir=directory, prefix="export-", suffix=".zip")
    os.close(handle)
    path = Path(name)
    try:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr("recording.json", meta.model_dump_json(exclude={"owner", "entries"}),
                             compress_type=zipfile.ZIP_DEFLATED)
            archive.writestr("trajectory.jsonl", b"".join(trajectory_lines(entries)),
                             compress_type=zipfile.ZIP_DEFLATED)
            for sub in ("frames", "shots"):  # JPEG and PNG are compressed already
                for file in sorted((directory / sub).iterdir()):
                    archive.write(file, f"{sub}/{file.name}")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
