"""The recordings going on: which sessions record, and when each one's frames are taken.

A recording begins with ``"record": true`` at create or ``POST .../recording/start`` and
ends when asked, when its session ends, or at the key's quota; it stays on disk
(recording_store.py) until it expires. Frames are taken only while the session runs: the
session layer calls :meth:`watch` and :meth:`unwatch` where it starts and stops the
browser watch (pause, resume, checkpoints). Each recording follows its session's events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import QuotaExceeded
from ..schemas.sessions import SessionState
from .desktop import AnyDesktop
from .events import EventLog
from .lifecycle import LIVE_STATES, SessionRecord
from .live import not_live
from .recorder import Recorder
from .recording_media import Videos
from .recording_store import RecordingMeta, RecordingStore

__all__ = ["Recordings"]

log = logging.getLogger("deskbox.recordings")


class Recordings:
    def __init__(
        self, store: RecordingStore, events: EventLog, fps: float, quality: int,
        quota_bytes: int,
    ) -> None:
        self.store = store
        self.videos = Videos(store, quota_bytes)  # GET .../recording.mp4 (recording_media.py)
        self._events = events
        self._fps = fps
        self._quality = quality
        self._quota = quota_bytes
        self._live: dict[str, Recorder] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._ending: set[asyncio.Task[RecordingMeta | None]] = set()
        # Starts under way: a second start joins the first, an end waits for it (two
        # starts once made two recorders, the first never stopped; an end during a start
        # found nothing to stop, and the start then recorded an ended session).
        self._beginning: dict[str, asyncio.Future[RecordingMeta]] = {}
        # Stops under way, from the recorder's removal to the recording's end written: a
        # start waits for it, and so does a second stop (a start during a stop recorded on
        # in a recording the stop then marked stopped, which expired under its recorder).
        self._stopping: dict[str, asyncio.Future[RecordingMeta]] = {}

    def recorder(self, session_id: str) -> Recorder | None:
        return self._live.get(session_id)

    async def begin(self, record: SessionRecord, handle: AnyDesktop | None) -> RecordingMeta:
        """Record the session from now on (it goes on if it records already)."""
        while (stopping := self._stopping.get(record.id)) is not None:
            await asyncio.wait([stopping])  # its failure is its caller's to hear
        # The session may have ended during that wait, its end finding no start to wait
        # for: a recorder begun now would never be stopped (its tasks running for ever, the
        # recording never expiring, counted against the key's quota). No await from here
        # to the start's registration below, so a later end waits for the start.
        if record.state is SessionState.stopping or record.state not in LIVE_STATES:
            raise not_live(record)
        recorder = self._live.get(record.id)
        if recorder is not None:
            return recorder.meta
        beginning = self._beginning.get(record.id)
        if beginning is None:
            beginning = asyncio.ensure_future(self._begin(record, handle))
            self._beginning[record.id] = beginning
            beginning.add_done_callback(lambda _: self._beginning.pop(record.id, None))
        return await asyncio.shield(beginning)

    async def _begin(self, record: SessionRecord, handle: AnyDesktop | None) -> RecordingMeta:
        owner = record.owner
        self.check_quota(owner)
        meta = await asyncio.to_thread(self.store.begin, owner, record.id)
        display = record.body.display
        recorder = Recorder(
            meta, self.store, (display.width, display.height), self._fps, self._quality,
            lambda size: self.store.used(owner) + size <= self._quota,
            lambda reason: self._end_soon(record.id, reason), record.body.coordinate_space,
        )
        self._live[record.id] = recorder
        history = self._events.history(record.id)
        recorder.event(self._events.publish(record.id, "recording_started"))
        self._followers[record.id] = asyncio.create_task(
            self._follow(recorder, history[-1].id if history else 0),
            name=f"deskbox-recording-events-{record.id}")
        if handle is not None and record.state is SessionState.running:
            await recorder.watch_from_now(handle)
        log.info("session %s: recording", record.id)
        return meta

    def check_quota(self, owner: str) -> None:
        """QuotaExceeded (429) if ``owner``'s recordings fill their quota."""
        if self.store.used(owner) >= self._quota:
            raise QuotaExceeded(f"the API key's recordings use their quota of "
                                f"{self._quota >> 20} MiB; delete some first")

    async def end(self, session_id: str, reason: str | None = None) -> RecordingMeta | None:
        """Stop the session's recording (None: it was not recording; a stop under way is
        waited for); ``reason`` None: it was asked to."""
        beginning = self._beginning.get(session_id)
        if beginning is not None:
            # Its failure is its caller's to hear; what it started is ended below.
            await asyncio.wait([beginning])
        stopping = self._stopping.get(session_id)
        if stopping is None:
            recorder = self._live.pop(session_id, None)
            if recorder is None:
                return None
            stopping = asyncio.ensure_future(self._stop(recorder, reason))
            self._stopping[session_id] = stopping
            stopping.add_done_callback(lambda _: self._stopping.pop(session_id, None))
        return await asyncio.shield(stopping)

    async def _stop(self, recorder: Recorder, reason: str | None) -> RecordingMeta:
        session_id = recorder.meta.session_id
        follower = self._followers.pop(session_id, None)
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        recorder.event(self._events.publish(session_id, "recording_stopped",
                                            reason=reason or "asked"))
        await recorder.close()
        meta = recorder.meta
        self.store.stopped(meta, reason)
        try:  # a full disk: saved at a later sweep (recording_store.py)
            await asyncio.to_thread(self.store.save_when_room, meta)
        except OSError as error:  # the session's end goes on all the same
            log.error("session %s: its recording's end was not written: %s", session_id, error)
        log.info("session %s: recording stopped (%s; %d frames, %d actions, %d bytes)",
                 session_id, reason or "asked", meta.frames, meta.actions, meta.bytes)
        return meta

    def _end_soon(self, session_id: str, reason: str) -> None:
        task = asyncio.create_task(self.end(session_id, reason))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _follow(self, recorder: Recorder, after: int) -> None:
        async for event in self._events.follow(recorder.meta.session_id, after=after):
            if event is not None and event.type != "recording_started":
                recorder.event(event)

    def watch(self, session_id: str, handle: AnyDesktop) -> None:
        recorder = self._live.get(session_id)
        if recorder is not None:
            recorder.watch(handle)

    async def unwatch(self, session_id: str) -> None:
        recorder = self._live.get(session_id)
        if recorder is not None:
            await recorder.unwatch()

    async def close(self) -> None:
        """The server stops: every recording stops, what waited is written."""
        for session_id in list(self._live):
            await self.end(session_id, "the server stopped")
        await asyncio.gather(*self._ending, return_exceptions=True)
