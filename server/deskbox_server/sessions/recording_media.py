"""What a recording is read as: its trajectory (JSON lines, each action with the frames
before and after it), its video (H.264 in MP4, encoded by PyAV's FFmpeg) and a zip export.
Blocking, run on a worker thread, but :class:`Videos` (the event loop's).

Frames were taken when the screen changed, so an action's frames are found by time:
``frame_before`` is the last frame taken at or before the action began; ``frame_after``
the first one taken after it ended and before the next action began, else (nothing
changed on screen) the last one at or before its end.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import Capacity, NotFound, SessionFailed, Timeout
from .recording_store import VIDEO_PARTIAL, VIDEOS, RecordingMeta, RecordingStore

__all__ = ["Export", "Trajectory", "Videos", "export", "file_chunks", "frame_path",
           "trajectory", "trajectory_lines", "zip_chunks"]

_ENCODE_TIMEOUT_S = 600
_CHUNK = 1 << 20  # of the zip, sent as it is made, and of a video not kept
_LINES_CHUNK = 1 << 16  # of the trajectory's lines: each one a step of a worker thread


@dataclass(frozen=True)
class _Line:
    t: float
    seq: int
    offset: int
    length: int


@dataclass(frozen=True)
class Trajectory:
    """Where each entry of a recording's ``trajectory.jsonl`` is, in time order, and the
    times of its frames and actions: all an entry's ``frame_before`` and ``frame_after``
    need. The entries themselves are read again one at a time as they are sent: read whole
    and parsed, a long recording's took about eight times its size in the server's memory,
    for each request at once."""

    path: Path
    lines: list[_Line]
    frames: list[tuple[float, int]]  # (time, number), in time order
    action_starts: list[float]
    end: float  # the last time anything recorded happened

    def entries(self) -> Iterator[dict[str, Any]]:
        """Every entry in time order, actions with ``frame_before`` and ``frame_after``."""
        times, starts = [t for t, _ in self.frames], self.action_starts
        numbers = [n for _, n in self.frames]
        try:
            file = self.path.open("rb")
        except FileNotFoundError:  # the recording deleted meanwhile
            return
        actions = 0
        with file:
            for line in self.lines:
                file.seek(line.offset)
                entry = json.loads(file.read(line.length))
                if entry["kind"] == "action":
                    actions += 1
                    next_start = starts[actions] if actions < len(starts) else None
                    before = bisect.bisect_right(times, entry["t"]) - 1
                    entry["frame_before"] = numbers[before] if before >= 0 else None
                    after = bisect.bisect_left(times, entry["end_t"])
                    if after < len(times) and (next_start is None or times[after] < next_start):
                        entry["frame_after"] = numbers[after]
                    else:
                        unchanged = bisect.bisect_right(times, entry["end_t"]) - 1
                        entry["frame_after"] = numbers[unchanged] if unchanged >= 0 else None
                yield entry


def trajectory(store: RecordingStore, meta: RecordingMeta) -> Trajectory:
    """The recording's trajectory as it is now (a recording goes on: later lines are left
    for a later request). Blocking: reads the file once."""
    path = store.directory(meta.session_id) / "trajectory.jsonl"
    lines: list[_Line] = []
    frames: list[tuple[float, int]] = []
    starts: list[float] = []
    end = 0.0
    try:
        file = path.open("rb")
    except FileNotFoundError:
        return Trajectory(path, [], [], [], 0.0)
    with file:
        offset = 0
        for raw in file:
            length = len(raw)
            try:
                entry = json.loads(raw)
            except ValueError:  # a line cut short when the server was killed mid-write
                entry = None
            if isinstance(entry, dict):
                t = entry["t"]
                lines.append(_Line(t, entry["seq"], offset, length))
                end = max(end, t, entry.get("end_t", 0))
                if entry["kind"] == "frame":
                    frames.append((t, entry["frame"]))
                elif entry["kind"] == "action":
                    starts.append(t)
            offset += length
    lines.sort(key=lambda line: (line.t, line.seq))
    frames.sort()
    starts.sort()
    return Trajectory(path, lines, frames, starts, end)


def trajectory_lines(trajectory: Trajectory) -> Iterator[bytes]:
    """The JSON lines, in chunks of about ``_LINES_CHUNK`` bytes."""
    chunk: list[bytes] = []
    size = 0
    for entry in trajectory.entries():
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        chunk.append(line)
        size += len(line)
        if size >= _LINES_CHUNK:
            yield b"".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield b"".join(chunk)


def frame_path(store: RecordingStore, meta: RecordingMeta, number: int) -> Path:
    if not 0 <= number < meta.frames:
        raise NotFound(f"recording of session {meta.session_id} has no frame {number} "
                       f"(it has {meta.frames})")
    path = store.directory(meta.session_id) / "frames" / f"{number:06d}.jpg"
    if not path.is_file():  # the recording deleted (or expired) meanwhile
        raise NotFound(f"recording of session {meta.session_id} has no frame {number}")
    return path


@dataclass(frozen=True)
class _Video:
    target: Path  # video-<n>.mp4, of the first n frames
    partial: Path  # where it is encoded
    job: dict[str, Any]  # video_encode.py's
    made: bool  # already, by an earlier request


def _video_of(store: RecordingStore, meta: RecordingMeta) -> _Video:
    """The video of the frames so far. Blocking: reads the trajectory."""
    if meta.frames == 0 or meta.width is None or meta.height is None:
        raise NotFound(f"recording of session {meta.session_id} has no frame yet")
    directory = store.directory(meta.session_id)
    recorded = trajectory(store, meta)
    frames = recorded.frames
    if not frames:  # none written (the quota), or the recording deleted meanwhile
        raise NotFound(f"recording of session {meta.session_id} has no frame yet")
    # The last frame stays on screen until the last thing recorded.
    end = recorded.end
    target, partial = directory / f"video-{len(frames)}.mp4", directory / VIDEO_PARTIAL
    job = {"out": str(partial), "width": meta.width, "height": meta.height, "frames": [
        [t, str(directory / "frames" / f"{number:06d}.jpg")]
        for t, number in [*frames, (end, frames[-1][1])]]}
    return _Video(target, partial, job, target.exists())


def _clear_for(video: _Video) -> bool:
    """False: the video is to be made, the older ones are gone; True: it was made."""
    if video.target.exists():
        return True
    for old in video.target.parent.glob(VIDEOS):
        old.unlink(missing_ok=True)
    return False


def _unkept(partial: Path) -> BinaryIO:
    """The video, open, its file gone: nothing is left on disk however its sending ends."""
    file = partial.open("rb")
    partial.unlink()
    return file


def file_chunks(file: BinaryIO) -> Iterator[bytes]:
    """An open file's bytes, then it is closed (a StreamingResponse's body)."""
    with file:
        while chunk := file.read(_CHUNK):
            yield chunk


class Videos:
    """The videos of recordings, made on first request and kept (made again once more
    frames came) if they fit in the key's recording quota, where they count; one that does
    not fit is sent and not kept: the key's recordings stay within their quota on disk.
    One is encoded at a time (it takes a core), and each API key has one
    encode at most waiting or running: another is refused (429) rather than queued.

    Nothing here holds a thread while it waits: the wait for the encoder's turn is the
    event loop's, and the encoder a process the loop awaits. Encodes in worker threads of
    the loop's default executor (min(32, cores + 4) of them) held all of them for minutes,
    and every create, delete and snapshot listing of every key waited behind them."""

    def __init__(self, store: RecordingStore, quota_bytes: int) -> None:
        self._store = store
        self._quota = quota_bytes
        self._turn = asyncio.Lock()
        self._keys: set[str] = set()  # whose encode waits or runs

    async def video(self, meta: RecordingMeta) -> Path | BinaryIO:
        """The kept video's path, or the video open (not kept: past the key's quota)."""
        video = await asyncio.to_thread(_video_of, self._store, meta)
        if video.made:
            return video.target
        if meta.owner in self._keys:
            raise Capacity("a video of this API key's recordings is being made; ask again "
                           "once it is (one at a time per key)")
        self._keys.add(meta.owner)
        try:
            async with self._turn:
                return await self._make(meta, video)
        except (SessionFailed, OSError):
            # A delete (or expiry) took the frames from under the encoder: not frames the
            # sandbox made unreadable, and the server's paths are not the client's to see.
            if self._store.meta(meta.session_id) is not meta:
                raise NotFound(f"recording of session {meta.session_id} was deleted while "
                               "its video was made") from None
            raise
        finally:
            self._keys.discard(meta.owner)

    async def _make(self, meta: RecordingMeta, video: _Video) -> Path | BinaryIO:
        if await asyncio.to_thread(_clear_for, video):
            return video.target
        meta.video_bytes = 0  # the older videos are gone
        try:
            await _encode(video.job)
            size = (await asyncio.to_thread(video.partial.stat)).st_size
            if self._store.used(meta.owner) + size > self._quota:
                return await asyncio.to_thread(_unkept, video.partial)
            await asyncio.to_thread(os.replace, video.partial, video.target)
            meta.video_bytes = size
            return video.target
        finally:
            await asyncio.to_thread(video.partial.unlink, missing_ok=True)


async def _encode(job: dict[str, Any]) -> None:
    """Encoded by video_encode.py in a process of its own, which limits its memory and CPU
    time: the frames are a sandbox's JPEGs, hostile data to decode."""
    encoder = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deskbox_server.sessions.video_encode",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(_ENCODE_TIMEOUT_S):
            _, stderr = await encoder.communicate(json.dumps(job).encode())
    except TimeoutError:
        raise Timeout(f"encoding the video took over {_ENCODE_TIMEOUT_S:g} s") from None
    finally:
        if encoder.returncode is None:  # timed out, or its request was cancelled
            with contextlib.suppress(ProcessLookupError):
                encoder.kill()
            await encoder.wait()
    if encoder.returncode != 0:
        reason = stderr.decode(errors="replace").strip().splitlines()
        raise SessionFailed("the recording's frames could not be encoded: "
                            f"{reason[-1] if reason else f'exit {encoder.returncode}'}")


@dataclass(frozen=True)
class Export:
    """What a zip export holds, read when it was asked for."""

    directory: Path
    meta: RecordingMeta
    trajectory: Trajectory
    files: list[str]  # frames/… and shots/…, relative to the directory


def export(store: RecordingStore, meta: RecordingMeta) -> Export:
    directory = store.directory(meta.session_id)
    files = [f"{sub}/{file.name}" for sub in ("frames", "shots")
             for file in sorted((directory / sub).iterdir())]
    return Export(directory, meta, trajectory(store, meta), files)


class _Chunks:
    """What the zip writes, taken in chunks as it goes: a write-only stream, which
    zipfile writes with data descriptors instead of seeking back."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.size = 0  # of the parts not taken yet

    def write(self, data: bytes, /) -> int:
        self._parts.append(bytes(data))
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data, self._parts, self.size = b"".join(self._parts), [], 0
        return data


def _deflated(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, time.localtime()[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def zip_chunks(parts: Export) -> Iterator[bytes]:
    """The zip of the trajectory, the frames and the settled screenshots, made as it is
    sent: written whole into the state dir first, it took up to the key's recording quota
    again on disk, counted nowhere. Blocking: a file at a time."""
    sink = _Chunks()
    with zipfile.ZipFile(sink, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("recording.json", parts.meta.model_dump_json(exclude={"owner", "entries"}),
                         compress_type=zipfile.ZIP_DEFLATED)
        with archive.open(_deflated("trajectory.jsonl"), "w", force_zip64=True) as member:
            for line in trajectory_lines(parts.trajectory):
                member.write(line)
                if sink.size >= _CHUNK:
                    yield sink.take()
        yield sink.take()
        for name in parts.files:  # JPEG and PNG are compressed already
            archive.write(parts.directory / name, name)
            yield sink.take()
    yield sink.take()
