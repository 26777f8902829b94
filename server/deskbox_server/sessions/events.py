"""What happened to each session, kept briefly in memory for ``GET .../events`` (SSE).

The manager publishes state changes, the browser watch (browser_watch.py) the browser's
exits and restarts. Each session keeps its last :data:`KEEP_PER_SESSION` events; ended
sessions keep theirs until :data:`KEEP_ENDED` newer ones have ended. A server that restarts
starts with empty logs. Used from the event loop only.

Event ids are the wall clock in microseconds (:meth:`EventLog.next_id`), not a count: a client
resumes a stream with the ``Last-Event-ID`` it last saw on another server process (this one
restarted, or another replica of a fleet), which gets only the events above it. Numbered
from 1 by each process, the next server's events were all at or below that id, and none
was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..schemas.events import EventType, SessionEvent
from ..schemas.sessions import SessionState
from .lifecycle import utcnow

__all__ = ["KEEP_ENDED", "KEEP_PER_SESSION", "EventLog"]

KEEP_PER_SESSION = 256
KEEP_ENDED = 1024


@dataclass
class _Stream:
    events: deque[SessionEvent] = field(default_factory=lambda: deque(maxlen=KEEP_PER_SESSION))
    ended: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


class EventLog:
    def __init__(self) -> None:
        self._live: dict[str, _Stream] = {}
        self._ended: OrderedDict[str, _Stream] = OrderedDict()
        self._closed = False
        self._last_id = 0

    def next_id(self) -> int:
        """A new event id: above every id this log gave, and above those of a server that
        ran before this one (or of another server) as far as the hosts' clocks agree.
        Microseconds since the epoch stay below 2**53 (exact in a JavaScript number) until
        the year 2255. +1: ids stay unique and ordered when two events share a microsecond,
        or when the clock is set back while the server runs."""
        self._last_id = max(self._last_id + 1, time.time_ns() // 1000)
        return self._last_id

    def close(self) -> None:
        """The server stops: every live session's stream says so (``server_stopping``) and
        its followers' streams end, rather than hold the stop for the requests' grace and
        then be cut off. A client reconnects to the next server with ``Last-Event-ID``."""
        self._closed = True
        for session_id in list(self._live):
            self.publish(session_id, "server_stopping", reason="the server is stopping")

    def publish(
        self,
        session_id: str,
        event_type: EventType,
        *,
        state: SessionState | None = None,
        reason: str | None = None,
        browser_restarts: int | None = None,
    ) -> SessionEvent:
        stream = self._live.get(session_id)
        if stream is None:
            stream = self._live[session_id] = _Stream()
        event = SessionEvent(
            id=self.next_id(), type=event_type, at=utcnow(), session_id=session_id,
            state=state, reason=reason, browser_restarts=browser_restarts,
        )
        stream.events.append(event)
        stream.wake()
        return event

    def history(self, session_id: str) -> list[SessionEvent]:
        stream = self._live.get(session_id) or self._ended.get(session_id)
        return list(stream.events) if stream is not None else []

    def end(self, session_id: str) -> None:
        """The session is over: followers get what is left, then their stream ends."""
        stream = self._live.pop(session_id, None)
        if stream is None:
            return
        stream.ended = True
        stream.wake()
        self._ended[session_id] = stream
        while len(self._ended) > KEEP_ENDED:
            self._ended.popitem(last=False)

    async def follow(
        self, session_id: str, after: int = 0, heartbeat_s: float | None = None
    ) -> AsyncIterator[SessionEvent | None]:
        """The kept events with an id above ``after``, then new ones as they come.

        Yields None every ``heartbeat_s`` without news (so a stream can send a comment and
        notice a client that left); ends once the session has ended and all was yielded.
        """
        stream = self._live.get(session_id) or self._ended.get(session_id)
        if stream is None:
            stream = self._live[session_id] = _Stream()  # a live session with no news yet
        while True:
            changed = stream.changed
            for event in list(stream.events):
                if event.id > after:
                    after = event.id
                    yield event
            if stream.ended or self._closed:
                return
            try:
                await asyncio.wait_for(changed.wait(), heartbeat_s)
            except TimeoutError:
                yield None
