"""A recording's start that waited for a stop, while the session ended (recordings.py).

The recordings, their store and the recorder are the server's own and real (files in tmp);
the store's save of the stop's end is held until the test lets it go (our seam), so that a
start and the session's end both come while the stop is under way, in a known order.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from deskbox_server.errors import NotFound
from deskbox_server.schemas.sessions import SessionCreate, SessionState
from deskbox_server.sessions.events import EventLog
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.recording_store import RecordingMeta, RecordingStore
from deskbox_server.sessions.recordings import Recordings

OWNER = "key_0123456789abcdef"
SESSION = "ses_0123456789abcdefghij"


class HeldStore(RecordingStore):
    """Saves as the store does; once ``hold`` is set, a save of a stopped recording waits
    for ``release`` (``saving`` says it began)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, timedelta(hours=1))
        self.hold = threading.Event()
        self.saving = threading.Event()
        self.release = threading.Event()

    def save(self, meta: RecordingMeta) -> None:
        if self.hold.is_set() and meta.state == "stopped":
            self.saving.set()
            assert self.release.wait(10), "the test never let the save go"
        super().save(meta)


async def test_a_start_waiting_for_a_stop_is_refused_once_the_session_ended(
    tmp_path: Path,
) -> None:
    """The start began a recorder for the ended session once the stop was done: a
    recording `recording` for ever (no expiry, counted in the key's quota), its writer
    and event tasks running on, and its `recording_started` event making the ended
    session's event stream live again. It is refused now, as a start on an ended session
    is (404), and nothing of it is left."""
    store = HeldStore(tmp_path / "recordings")
    await asyncio.to_thread(store.open)
    events = EventLog()
    recordings = Recordings(store, events, 4.0, 60, 1 << 30)
    # Paused: no frames to take, so no desktop is needed.
    record = SessionRecord(id=SESSION, owner=OWNER, backend="local", body=SessionCreate(),
                           timeout_s=300, state=SessionState.paused)
    await recordings.begin(record, None)

    store.hold.set()
    stop = asyncio.create_task(recordings.end(SESSION))  # POST .../recording/stop
    await asyncio.to_thread(store.saving.wait, 10)
    start = asyncio.create_task(recordings.begin(record, None))  # .../recording/start
    for _ in range(3):
        await asyncio.sleep(0)
    assert not start.done()  # it waits for the stop

    async def session_end() -> None:  # as start_stop.end and the manager's _end do
        record.transition(SessionState.stopping)
        await recordings.end(SESSION, "the session ended")
        record.transition(SessionState.stopped)
        events.end(SESSION)

    ended = asyncio.create_task(session_end())
    for _ in range(3):
        await asyncio.sleep(0)
    store.release.set()
    stopped, _ = await asyncio.gather(stop, ended)
    assert stopped is not None and stopped.state == "stopped"
    with pytest.raises(NotFound, match=f"session {SESSION} is stop"):
        await start

    assert recordings.recorder(SESSION) is None
    meta = store.meta(SESSION)
    assert meta is not None and meta.state == "stopped" and meta.expires_at is not None
    left = [task.get_name() for task in asyncio.all_tasks()
            if SESSION in task.get_name()]
    assert left == []
    kinds = [event.type for event in events.history(SESSION)]
    assert kinds[-1] == "recording_stopped", kinds
    await recordings.close()
