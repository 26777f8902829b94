"""The session state machine and the record the registry keeps of each session.

::

    starting ──► running ⇄ paused / hibernated
        │           │              │
        └───────────┴──► stopping ─┴──► stopped
        any live state ──► failed (with a reason)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ..errors import Internal
from ..schemas.sessions import Failure, SessionCreate, SessionState

__all__ = ["LIVE_STATES", "Idempotency", "SessionRecord", "can_transition", "utcnow"]

S = SessionState

_TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    S.starting: frozenset({S.running, S.stopping, S.failed}),
    S.running: frozenset({S.paused, S.hibernated, S.stopping, S.failed}),
    S.paused: frozenset({S.running, S.stopping, S.failed}),
    S.hibernated: frozenset({S.running, S.stopping, S.failed}),
    S.stopping: frozenset({S.stopped, S.failed}),
    S.stopped: frozenset(),
    S.failed: frozenset(),
}

LIVE_STATES = frozenset({S.starting, S.running, S.paused, S.hibernated, S.stopping})


def can_transition(old: SessionState, new: SessionState) -> bool:
    return new in _TRANSITIONS[old]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Idempotency:
    """The ``Idempotency-Key`` a create was sent with, and a digest of what it asked for:
    a retry with the same key gets this session, one with another request is refused."""

    key: str
    request: str  # sha256 hex of the create's body (idempotency.py)


@dataclass
class SessionRecord:
    """What the registry stores of one session; ``owner`` is the id of its API key."""

    id: str
    owner: str
    backend: str
    body: SessionCreate
    timeout_s: int
    state: SessionState = S.starting
    created_at: datetime = field(default_factory=utcnow)
    expires_at: datetime | None = None
    failure: Failure | None = None
    ended_at: datetime | None = None  # when it became stopped or failed
    idempotency: Idempotency | None = None

    def transition(self, new: SessionState, reason: str | None = None) -> None:
        if not can_transition(self.state, new):
            raise Internal(f"session {self.id} cannot go from {self.state} to {new}")
        self.state = new
        now = utcnow()
        if new is S.failed:
            self.failure = Failure(reason=reason or "unknown", at=now)
        if new not in LIVE_STATES or new is S.stopping:
            self.expires_at = None
        if new not in LIVE_STATES:
            self.ended_at = now  # a failed session's is its failure's time, as in recovery

    def touch(self) -> None:
        """Push the idle expiry back by ``timeout_s`` from now."""
        self.expires_at = utcnow() + timedelta(seconds=self.timeout_s)

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def matches(self, state: SessionState | None, labels: dict[str, str]) -> bool:
        if state is not None and self.state is not state:
            return False
        return all(self.body.labels.get(k) == v for k, v in labels.items())
