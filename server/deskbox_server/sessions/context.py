"""What every session of a manager shares (the registry, the browser watch, the links,
the frame store, metrics, the volumes, the secrets, the recordings, the tokens) and the
two ways back to the manager: publish a state change, fail a session. The manager wires
one; session.py, state_changes.py and start_stop.py use it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import DeskboxError
from ..metrics import Metrics
from .browser_watch import BrowserWatch
from .desktop import AnyDesktop
from .events import EventLog
from .in_flight import ChangesInFlight
from .lifecycle import SessionRecord
from .links import SessionLinks
from .live import LiveSession
from .pause import FrameStore
from .recordings import Recordings
from .registry import Registry
from .secrets import SecretStore
from .tokens import TokenStore
from .volumes import VolumeStore

__all__ = ["SessionContext"]


@dataclass(frozen=True)
class SessionContext:
    """What every session of a manager shares; wired once by the manager."""

    registry: Registry
    browsers: BrowserWatch
    links: SessionLinks
    frames: FrameStore
    metrics: Metrics
    # Publish a state change as an event (events.py).
    publish: Callable[[SessionRecord], None]
    # Fail the session soon (the manager ends it and takes it out of its table). In a
    # fleet, a session another server ended is let go instead: the error to raise then.
    fail: Callable[[LiveSession, str], Awaitable[DeskboxError | None]]
    # The volumes sessions attach; a session's are free once its desktop is destroyed.
    volumes: VolumeStore
    # The API keys' secrets: typed (after a focus check) or given to one command.
    secrets: SecretStore
    # Every session's event stream (help requested, a human's control...).
    events: EventLog
    # The recordings going on; a recording takes frames while its session runs.
    recordings: Recordings
    # Pauses, resumes and checkpoints: they end even if their request goes (in_flight.py).
    changes: ChangesInFlight
    # The session tokens issued (tokens.py); an ended session's are forgotten.
    tokens: TokenStore

    def watch(self, session_id: str, handle: AnyDesktop) -> None:
        """The session runs (again): follow its browser, take its recording's frames."""
        self.browsers.start(session_id, handle)
        self.recordings.watch(session_id, handle)

    async def unwatch(self, session_id: str) -> None:
        """The session stops running (a pause, a checkpoint, its end): nothing of the
        server keeps a connection into it."""
        await self.browsers.stop(session_id)
        await self.recordings.unwatch(session_id)
