"""One session's recording while it records: its entries, frames and events.

The agent's hot path pays for a dict and a JSON line per action: entries and files wait
in memory and a writer task appends them to disk on a worker thread every
:data:`FLUSH_S` (recording_store.py). The video's frames come from the desktop's agent
(its ``watch`` call: a JPEG when the screen changed, captured and encoded inside the
sandbox, on its CPU budget), at most ``fps`` a second, while the session runs
(recordings.py starts and stops the loop with the session's state).

Each entry has ``seq`` and ``t`` (seconds since the recording began). Which frames were
before and after an action is worked out when the trajectory is read
(recording_media.py): frames may come after the action that caused them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from ..errors import DeskboxError
from ..media import EncodedImage
from ..schemas import actions as a
from ..schemas.events import SessionEvent
from ..schemas.results import BatchResult
from .desktop import AnyDesktop
from .human_input import HumanAction, HumanInput
from .recording_store import RecordingMeta, RecordingStore

__all__ = ["FLUSH_S", "Recorder", "Source"]

log = logging.getLogger("deskbox.recordings")

FLUSH_S = 0.5
_WATCH_S = 5.0  # one watch call's wait: a checkpoint's cancel leaves the agent this long
_RETRY_S = 1.0
_LAST_FRAME_S = 1.0  # a frame taken at once: when frames start or stop
_EXTS = {"image/jpeg": "jpeg", "image/png": "png", "image/webp": "webp"}

Source = dict[str, str]  # {"type": "api_key" | "token", "id": ...}


class Recorder:
    def __init__(
        self, meta: RecordingMeta, store: RecordingStore, screen: tuple[int, int],
        fps: float, quality: int, within_quota: Callable[[int], bool],
        stop: Callable[[str], None], space: a.CoordinateSpace | None = None,
    ) -> None:
        """``within_quota(n)``: may n more bytes be written; ``stop(reason)``: end this
        recording (the table does: recordings.py); ``space``: the session's
        ``coordinate_space``, the one its API actions use by default."""
        self.meta = meta
        self._store = store
        self._screen = screen
        self._space = space
        self._fps = fps
        self._quality = quality
        self._within_quota = within_quota
        self._stop = stop
        self._lines: list[bytes] = []
        self._files: list[tuple[str, bytes]] = []
        self._humans: dict[str, HumanInput] = {}
        self._writing = asyncio.Lock()
        self._writer = asyncio.create_task(self._write_forever(),
                                           name=f"deskbox-recorder-{meta.session_id}")
        self._frames: asyncio.Task[None] | None = None
        self._watched: AnyDesktop | None = None
        self.closed = False
        # Frames on disk: those numbered but dropped unwritten (the quota, a full disk) are
        # not counted as the recording's, whose frame N must then be a file.
        self._frames_written = meta.frames
        self._dropping = False

    def now(self) -> float:
        """Seconds since the recording began (it may have been stopped and begun again)."""
        return time.time() - self.meta.started_at.timestamp()

    # -- entries --------------------------------------------------------------------------

    def _entry(self, kind: str, t: float, **fields: Any) -> None:
        entry = {"seq": self.meta.entries, "kind": kind, "t": round(t, 3), **fields}
        self._lines.append(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        self.meta.entries += 1

    def batch(
        self, source: Source, actions: Sequence[a.Action], view: a.CoordinateSpace | None,
        started: float, result: BatchResult | None, error: DeskboxError | None,
    ) -> None:
        """A batch the API ran (or refused: ``error``), each action an entry. The error is
        the action's that failed (``action_index``), else the batch's last; the actions after
        the one that failed were not done (``skipped``)."""
        if self.closed:
            return
        ended = self.now()
        shot = result.screenshot if result is not None else None
        failed = len(actions) - 1
        if error is not None and error.action_index is not None:
            failed = min(error.action_index, failed)
        for index, action in enumerate(actions):
            last = index == len(actions) - 1
            fields: dict[str, Any] = {
                "end_t": round(ended, 3), "source": source, "action": _wire(action),
                "screen_point": self._screen_point(action, view),
            }
            if error is not None and index == failed:
                fields["error"] = {"type": error.kind, "message": error.message}
            elif error is not None and index > failed:
                fields["skipped"] = True
            if last and shot is not None:
                name = f"shots/{self.meta.entries:06d}.{_EXTS[shot.media_type]}"
                fields["screenshot"] = name
                self._files.append((name, shot.data))
            self._entry("action", started, **fields)
            self.meta.actions += 1

    def refused(
        self, source: Source, sent: object, actions: Sequence[dict[str, object]] | None,
        error: DeskboxError, dialect: str | None = None,
    ) -> None:
        """A call refused for its input before it became actions (the schema's bounds, a
        vendor's input that translates to none). ``actions``: what it sent read as the
        API's actions (objects with a ``type``), each an action entry as :meth:`batch`
        makes (no screen point: none was read); None: one ``refused`` entry of ``sent``,
        ``dialect`` naming whose tool input it is."""
        if self.closed:
            return
        now = self.now()
        failure = {"type": error.kind, "message": error.message}
        common: dict[str, Any] = {"end_t": round(now, 3), "source": source}
        try:
            if actions is None:
                named = {"dialect": dialect} if dialect is not None else {}
                self._entry("refused", now, **common, sent=sent, **named, error=failure)
                return
            for index, action in enumerate(actions):
                last = {"error": failure} if index == len(actions) - 1 else {}
                self._entry("action", now, **common, action=action, screen_point=None, **last)
                self.meta.actions += 1
        except RecursionError:  # nested past what json.dumps takes here: the refusal only
            self._entry("refused", now, **common, sent=None, error=failure)

    def human(self, viewer_id: str, source: Source, message: bytes) -> None:
        """One RFB input message of a control viewer (``viewer_id``: its connection)."""
        if self.closed:
            return
        viewer = self._humans.get(viewer_id)
        if viewer is None:
            viewer = self._humans[viewer_id] = HumanInput(
                lambda done: self._human_action(source, done), self.now)
        viewer.message(message)

    def human_left(self, viewer_id: str) -> None:
        viewer = self._humans.pop(viewer_id, None)
        if viewer is not None:
            viewer.flush()

    def _human_action(self, source: Source, done: HumanAction) -> None:
        action = done.action
        point = None
        if "x" in action:
            point = {"x": action["x"], "y": action["y"]}
        elif action["type"] == "drag":
            path = action["path"]
            assert isinstance(path, list)
            point = {"x": path[0][0], "y": path[0][1]}
        if self._space is not None:
            action = self._in_space(action, self._space)
        self._entry("action", done.started, end_t=round(done.ended, 3), source=source,
                    action=_as_recorded(action), screen_point=point)
        self.meta.actions += 1

    def _in_space(self, action: dict[str, object], space: a.CoordinateSpace
                  ) -> dict[str, object]:
        """A human's action (screen pixels, as the viewer sends them) in the session's
        coordinate space, as its agent's actions are recorded: a replay sends both alike,
        and a dataset reads them alike."""
        width, height = self._screen

        def point(x: object, y: object) -> list[int]:
            assert isinstance(x, int) and isinstance(y, int)
            return [_from_screen(x, width, space.width), _from_screen(y, height, space.height)]

        mapped = dict(action)
        if "x" in action:
            mapped["x"], mapped["y"] = point(action["x"], action["y"])
        if isinstance(path := action.get("path"), list):
            mapped["path"] = [point(x, y) for x, y in path]
        return mapped

    def event(self, event: SessionEvent) -> None:
        if not self.closed:
            self._entry("event", event.at.timestamp() - self.meta.started_at.timestamp(),
                        event=event.model_dump(mode="json", exclude_none=True,
                                               exclude={"session_id", "id"}))

    def _screen_point(
        self, action: a.Action, view: a.CoordinateSpace | None
    ) -> dict[str, int] | None:
        """Where the action acts, in the screen's pixels (the replay's click marker)."""
        if isinstance(action, a.Drag):
            x, y = action.path[0]
        elif isinstance(action, a.Click | a.Move | a.MouseDown | a.MouseUp | a.Scroll):
            if action.x is None or action.y is None:
                return None
            x, y = action.x, action.y
        else:
            return None
        if view is not None:
            width, height = self._screen
            x, y = _to_screen(x, view.width, width), _to_screen(y, view.height, height)
        return {"x": x, "y": y}

    # -- the video's frames ---------------------------------------------------------------

    def watch(self, handle: AnyDesktop, first: bool = True) -> None:
        """Take frames from this desktop (it runs) until :meth:`unwatch`; ``first``: the
        first one at once, whether the screen changed or not."""
        if self._frames is None and not self.closed:
            self._watched = handle
            self._frames = asyncio.create_task(
                self._take_frames(handle, first), name=f"deskbox-frames-{self.meta.session_id}")

    async def watch_from_now(self, handle: AnyDesktop) -> None:
        """:meth:`watch`, once the screen as it is now is a frame (so that the first
        action recorded has a frame before it)."""
        await self._last_frame(handle)
        self.watch(handle, first=False)

    async def unwatch(self) -> None:
        """Stop taking frames, after one last of the screen as it is: the loop may be
        waiting out its frame cap while the last action's change is on screen."""
        task, self._frames = self._frames, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        handle, self._watched = self._watched, None
        if handle is not None:
            await self._last_frame(handle)

    async def _last_frame(self, handle: AnyDesktop) -> None:
        """The screen as it is, now."""
        try:
            async with asyncio.timeout(_LAST_FRAME_S):
                image = await handle.watch(_LAST_FRAME_S, self._quality, now=True)
        except (DeskboxError, TimeoutError):
            return  # a desktop that fails or ends: the frames so far are what there is
        if image is not None:
            self._frame(image)

    async def _take_frames(self, handle: AnyDesktop, first: bool) -> None:
        interval = 1.0 / self._fps
        while True:
            started = time.monotonic()
            try:
                image = await handle.watch(_WATCH_S, self._quality, now=first)
            except DeskboxError as error:
                log.debug("session %s: no frame: %s", self.meta.session_id, error.message)
                await asyncio.sleep(_RETRY_S)
                first = True
                continue
            first = False
            if image is not None:
                self._frame(image)
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    def _frame(self, image: EncodedImage) -> None:
        if self._dropping:
            return
        meta = self.meta
        if meta.width is None:
            meta.width, meta.height = image.width, image.height
        number = meta.frames
        meta.frames += 1
        self._files.append((f"frames/{number:06d}.jpg", image.data))
        self._entry("frame", self.now(), frame=number)

    # -- to disk --------------------------------------------------------------------------

    async def _write_forever(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            for viewer in self._humans.values():
                viewer.tick()
            await self.flush()

    async def flush(self) -> None:
        """Write what waits; past the key's quota, the recording stops (nothing more is
        kept than what fit)."""
        async with self._writing:
            lines, files = self._lines, self._files
            if not lines and not files:
                return
            self._lines, self._files = [], []
            size = sum(len(line) for line in lines) + sum(len(data) for _, data in files)
            if not self._within_quota(size):
                self._drop("the API key's recording quota is used up")
                return
            meta = self.meta
            try:
                meta.bytes += await asyncio.to_thread(self._store.append, meta, lines, files)
            except OSError as error:  # a full disk: stop, rather than hold entries in memory
                log.error("session %s: cannot write its recording: %s", meta.session_id, error)
                self._drop(f"the recording could not be written: {error.strerror}")
                return
            self._frames_written += sum(1 for name, _ in files if name.startswith("frames/"))
            try:
                await asyncio.to_thread(self._store.save, meta)
            except OSError as error:
                log.error("session %s: cannot write its recording: %s", meta.session_id, error)
                self._drop(f"the recording could not be written: {error.strerror}")

    def _drop(self, why: str) -> None:
        """Nothing more is taken nor counted; the frames not written are not the recording's."""
        self._dropping = True
        self._lines, self._files = [], []
        self.meta.frames = self._frames_written
        if not self.closed:
            self.closed = True
            self._stop(why)

    async def close(self) -> None:
        """Stop taking frames and entries; write what waits. Idempotent."""
        for viewer in list(self._humans.values()):
            viewer.flush()
        self._humans.clear()
        self.closed = True
        await self.unwatch()
        # Not in the middle of a flush: its lines would be written by a thread nobody
        # waits for, after the recording was reported stopped and read back.
        async with self._writing:
            self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
        await self.flush()


def _to_screen(value: int, view: int, screen: int) -> int:
    """A coordinate of the view in screen pixels, as the desktop maps it (the agent's
    ``Space.to_screen``: to the nearest pixel, the last one at most)."""
    return min(round(value * screen / view), screen - 1)


def _from_screen(value: int, screen: int, view: int) -> int:
    """A screen pixel in the view's coordinates, as the desktop maps it back (the agent's
    ``Space.from_screen``: to the nearest, the last one at most)."""
    return min(round(value * view / screen), view - 1)


def _as_recorded(action: dict[str, object]) -> dict[str, Any]:
    """A human's action kept as the API's are (:func:`_wire`: its defaults left out, a left
    click with no ``button``), so a dataset reads both alike. One the API would refuse
    (an RFB viewer may send a point past any screen) is kept as the viewer sent it."""
    try:
        return _wire(a.ActionAdapter.validate_python(action))
    except ValidationError:
        return action


def _wire(action: a.Action) -> dict[str, Any]:
    """The action as the trajectory keeps it: a secret's name, never its value."""
    wire = {"type": action.type, **action.model_dump(mode="json", exclude_defaults=True)}
    if isinstance(action, a.TypeText) and action.secret is not None:
        wire.pop("text", None)
        wire["secret"] = action.secret
    return wire
