"""The registry of a fleet of servers (``DESKBOX_REGISTRY=cluster``): every record is also
written where the whole fleet reads it (an engine's :class:`SharedRecords`: Secrets in the
cluster), and read from there first, so that any server answers for any session.

The local SQLite file stays beside it: a server's own counts of ended sessions, and what a
lookup falls back on for records the fleet swept.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from pathlib import Path

from ..engines.base import SharedEntry, SharedRecords
from .lifecycle import LIVE_STATES, SessionRecord, utcnow
from .listing import SessionQuery, position
from .registry import Registry, record_from_json, record_json

__all__ = ["SharedRegistry"]

log = logging.getLogger("deskbox.sessions")
# How long the fleet keeps an ended session's record (GET answers it until then).
_ENDED_KEPT = timedelta(days=1)
# A record takes ~17 µs to decode: more than this many at once go to a thread, so that a
# key's day of records (thousands) or a fleet's live sessions never stall the event loop.
_DECODE_ON_LOOP = 64


def _versioned(entries: list[SharedEntry]) -> list[tuple[SessionRecord, str]]:
    records = []
    for entry in entries:
        try:
            records.append((record_from_json(entry.record), entry.version))
        except ValueError as error:
            log.warning("the shared record of session %s is unreadable: %s",
                        entry.session_id, error)
    return records


async def _decoded(entries: list[SharedEntry]) -> list[tuple[SessionRecord, str]]:
    if len(entries) <= _DECODE_ON_LOOP:
        return _versioned(entries)
    return await asyncio.to_thread(_versioned, entries)


async def _records(entries: list[SharedEntry]) -> list[SessionRecord]:
    return [record for record, _ in await _decoded(entries)]


class SharedRegistry(Registry):
    shared = True

    def __init__(self, path: Path, records: SharedRecords) -> None:
        super().__init__(path)
        self.records = records

    async def save(self, record: SessionRecord) -> None:
        # The fleet's copy first: a failure there leaves the local one as it was.
        await self.records.put(record.id, record.owner, record.state in LIVE_STATES,
                               record_json(record))
        await super().save(record)

    async def get(self, session_id: str) -> SessionRecord | None:
        entry = await self.records.read(session_id)
        if entry is None:
            return await super().get(session_id)
        found = await _records([entry])
        return found[0] if found else None

    async def owned(self, owner: str) -> list[SessionRecord]:
        """Every session of one API key the fleet keeps."""
        return [r for r in await _records(await self.records.owned(owner)) if r.owner == owner]

    async def by_idempotency_key(self, owner: str, key: str) -> SessionRecord | None:
        # Two retries reaching two servers at the same moment may both create: the fleet's
        # records (Secrets) have no unique index to make one of them lose.
        found = [r for r in await self.owned(owner)
                 if r.idempotency is not None and r.idempotency.key == key]
        return max(found, key=position) if found else None

    async def page(self, query: SessionQuery) -> tuple[list[SessionRecord], bool]:
        # The fleet keeps a key's records of a day (sweep): few enough to page here.
        found = sorted((r for r in await self.owned(query.owner) if query.matches(r)),
                       key=position, reverse=True)
        return found[:query.limit], len(found) > query.limit

    async def live(self) -> list[SessionRecord]:
        """The fleet's live sessions (whichever server serves them)."""
        return await _records(await self.records.live())

    async def live_versions(self) -> list[tuple[SessionRecord, str]]:
        """:meth:`live`, each with the version it was read at (for :meth:`save_if`)."""
        return await _decoded(await self.records.live())

    async def save_if(self, record: SessionRecord, version: str) -> bool:
        """Save the record only if the fleet's copy is still at ``version`` (no server
        changed it since it was read); whether it was saved."""
        if not await self.records.put_if(record.id, record.state in LIVE_STATES,
                                         record_json(record), version):
            return False
        await super().save(record)
        return True

    async def sweep(self) -> list[str]:
        """Forget the fleet's records of sessions that ended and were made over a day ago;
        their ids."""
        cutoff = utcnow() - _ENDED_KEPT
        swept = []
        for record in await _records(await self.records.ended()):
            if record.state not in LIVE_STATES and record.created_at < cutoff:
                await self.records.delete(record.id)
                swept.append(record.id)
        return swept
