"""What ``GET /v1/sessions`` asks of the registry: one page of a key's sessions; and the
cursors of every paged list (sessions, recordings).

Newest first, by (created_at, id); a page ends with an opaque cursor for the next one. A
cursor names a position, not a session, so a page goes on where the last one ended even if
that session was deleted meanwhile, and sessions made since do not shift it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ..errors import InvalidRequest
from ..schemas.sessions import SessionState
from .lifecycle import SessionRecord

__all__ = [
    "MAX_PAGE", "Position", "SessionQuery", "decode_cursor", "encode_cursor", "position",
]

MAX_PAGE = 1000  # 30-50 ms to answer, 20-30 of them on the event loop (bench/listing.py)

Position = tuple[datetime, str]  # (time, id) of the last item of a page, e.g. a session's


@dataclass(frozen=True)
class SessionQuery:
    owner: str
    states: frozenset[SessionState] = frozenset()  # empty: any state
    labels: Mapping[str, str] | None = None  # every one of them
    after: Position | None = None
    limit: int = MAX_PAGE

    def matches(self, record: SessionRecord) -> bool:
        return (record.owner == self.owner
                and (not self.states or record.state in self.states)
                and record.matches(None, dict(self.labels or {}))
                and (self.after is None or position(record) < self.after))


def position(record: SessionRecord) -> Position:
    return record.created_at, record.id


def encode_cursor(at: Position) -> str:
    """The opaque cursor of a page that ended at ``at`` (a time and an id)."""
    when, ident = at
    raw = f"{when.isoformat()} {ident}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    """The position a cursor of :func:`encode_cursor` names; InvalidRequest otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, session_id = raw.split(" ")
        when = datetime.fromisoformat(created_at)
        if when.tzinfo is None or not session_id:
            raise ValueError("not a cursor of ours")
        return when.astimezone(UTC), session_id  # as the registry writes its times
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest(
            "cursor: not a cursor this server gave (pass next_cursor as it came)"
        ) from None
