"""The fleet's shared records as the servers of a fleet see them, in memory (a seam we
own: engines/base.py's SharedRecords; the cluster's Secrets are tested in
tests/kubernetes)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection
from pathlib import Path

from deskbox_server.engines.base import SharedEntry
from deskbox_server.sessions.shared_registry import SharedRegistry


class FleetTable:
    def __init__(self) -> None:
        self.entries: dict[str, SharedEntry] = {}
        self.live_ids: set[str] = set()
        self._writes = 0

    def _write(self, session_id: str, record: str) -> None:
        self._writes += 1  # each write a new version, as a resourceVersion
        old = self.entries.get(session_id)
        self.entries[session_id] = SharedEntry(session_id, record, old.tokens if old else {},
                                               str(self._writes))

    async def put(self, session_id: str, owner: str, live: bool, record: str) -> None:
        self._write(session_id, record)
        (self.live_ids.add if live else self.live_ids.discard)(session_id)

    async def put_if(self, session_id: str, live: bool, record: str, version: str) -> bool:
        old = self.entries.get(session_id)
        if old is None or old.version != version:
            return False
        self._write(session_id, record)
        (self.live_ids.add if live else self.live_ids.discard)(session_id)
        return True

    async def read(self, session_id: str) -> SharedEntry | None:
        return self.entries.get(session_id)

    async def add_token(self, session_id: str, digest: str, token: str,
                        expired: Collection[str] = ()) -> bool:
        if session_id not in self.entries:
            return False
        for old in expired:
            self.entries[session_id].tokens.pop(old, None)
        self.entries[session_id].tokens[digest] = token
        return True

    async def drop_token(self, session_id: str, digest: str) -> None:
        self.entries[session_id].tokens.pop(digest, None)

    async def owned(self, owner: str) -> list[SharedEntry]:
        # Every entry: the registry keeps those of ``owner`` (as it does with the cluster's
        # answer, which selects by a hash of the key).
        return list(self.entries.values())

    async def live(self) -> list[SharedEntry]:
        return [self.entries[i] for i in sorted(self.live_ids)]

    async def ended(self) -> list[SharedEntry]:
        return [e for i, e in self.entries.items() if i not in self.live_ids]

    async def delete(self, session_id: str) -> None:
        raise NotImplementedError


@contextlib.asynccontextmanager
async def fleet_registry(directory: Path) -> AsyncIterator[SharedRegistry]:
    """A fleet server's registry over a table of its own, its SQLite file in ``directory``."""
    opened = SharedRegistry(directory / "sessions.sqlite3", FleetTable())
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()
