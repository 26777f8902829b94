"""A recording's end waits for the flush on its way: every entry is on disk once it
returns (recorder.py). The store is ours and real (files in tmp); its append is slowed, the
one stand-in, so that the end comes while a flush is writing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta
from pathlib import Path

from deskbox_server.schemas.events import SessionEvent
from deskbox_server.sessions.lifecycle import utcnow
from deskbox_server.sessions.recorder import FLUSH_S, Recorder
from deskbox_server.sessions.recording_store import RecordingMeta, RecordingStore


def help_requested(n: int) -> SessionEvent:
    return SessionEvent(id=n + 1, type="help_requested", at=utcnow(), session_id="ses_test",
                        reason=str(n))


class SlowStore(RecordingStore):
    """Appends as the store does, the first time 0.5 s late (a disk or a thread held up);
    ``writing`` is set when that one has begun."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, timedelta(days=1))
        self.writing = threading.Event()

    def append(self, meta: RecordingMeta, lines: list[bytes],
               files: list[tuple[str, bytes]]) -> int:
        if not self.writing.is_set():
            self.writing.set()
            time.sleep(0.5)
        return super().append(meta, lines, files)


async def test_the_end_of_a_recording_waits_for_the_flush_on_its_way(tmp_path: Path) -> None:
    store = SlowStore(tmp_path / "recordings")
    store.open()
    meta = store.begin("key", "ses_test")
    recorder = Recorder(meta, store, (640, 400), 2.0, 70, lambda size: True, lambda why: None)
    for n in range(5):
        recorder.event(help_requested(n))
    # The writer's own flush (every FLUSH_S) takes the five entries and is writing them.
    deadline = time.monotonic() + 5 * FLUSH_S
    while not store.writing.is_set():
        assert time.monotonic() < deadline, "the writer never flushed"
        await asyncio.sleep(0.01)
    recorder.event(help_requested(5))
    await recorder.close()
    lines = (store.directory("ses_test") / "trajectory.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"]["reason"] for line in lines] == [str(n) for n in range(6)]
