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
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import NotFound
from .recording_store import RecordingMeta, RecordingStore

__all__ = ["export_zip", "trajectory", "video"]

_VIDEO_LOCK = threading.Lock()  # one encoding at a time: it takes a core while it runs
_TIME_BASE = Fraction(1, 1000)


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
    return store.directory(meta.session_id) / "frames" / f"{number:06d}.jpg"


def video(store: RecordingStore, meta: RecordingMeta) -> Path:
    """The video of the frames so far, made on first request and kept (made again once
    more frames came)."""
    import av  # a large library: loaded when a video is first asked for
    from PIL import Image

    if meta.frames == 0:
        raise NotFound(f"recording of session {meta.session_id} has no frame yet")
    directory = store.directory(meta.session_id)
    entries = _entries(store, meta)
    frames = [(e["t"], e["frame"]) for e in entries if e["kind"] == "frame"]
    # The last frame stays on screen until the last thing recorded.
    end = max(max(e["t"], e.get("end_t", 0)) for e in entries)
    target = directory / f"video-{len(frames)}.mp4"
    with _VIDEO_LOCK:
        if target.exists():
            return target
        for old in directory.glob("video-*.mp4"):
            old.unlink(missing_ok=True)
        width, height = (meta.width or 2) // 2 * 2, (meta.height or 2) // 2 * 2  # 4:2:0
        with tempfile.NamedTemporaryFile(dir=directory, suffix=".mp4", delete=False) as part:
            partial = Path(part.name)
        try:
            with av.open(str(partial), mode="w", format="mp4") as container:
                stream = container.add_stream("libx264", rate=30)
                stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
                stream.time_base = stream.codec_context.time_base = _TIME_BASE
                stream.codec_context.options = {"preset": "veryfast", "crf": "28",
                                                "threads": "1"}
                last_pts, picture = -1, None
                for t, number in [*frames, (end, frames[-1][1])]:
                    with Image.open(directory / "frames" / f"{number:06d}.jpg") as image:
                        rgb = np.asarray(image.convert("RGB"))
                    picture = av.VideoFrame.from_ndarray(rgb, format="rgb24")
                    picture = picture.reformat(width=width, height=height, format="yuv420p")
                    # Frames come at most ``fps`` a second, never two in one millisecond.
                    last_pts = picture.pts = max(int(t * 1000), last_pts + 1)
                    picture.time_base = _TIME_BASE
                    container.mux(stream.encode(picture))
                container.mux(stream.encode(None))
            os.replace(partial, target)
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
