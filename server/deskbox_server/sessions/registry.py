"""The session registry: one SQLite file in the state directory.

sqlite3 blocks, so every query runs on the registry's own thread (one connection, one
thread, queries in order) and never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from ..errors import InsufficientStorage
from ..schemas.sessions import Failure, SessionCreate, SessionState
from .lifecycle import LIVE_STATES, Idempotency, SessionRecord
from .listing import SessionQuery

__all__ = ["Registry", "record_from_json", "record_json"]

P = ParamSpec("P")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    backend TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT,
    timeout_s INTEGER NOT NULL,
    failure TEXT,
    body TEXT NOT NULL,
    ended_at TEXT,
    idempotency_key TEXT,
    idempotency_request TEXT
);
"""
# After the migration of a registry made before a column existed (_migrate).
_INDEXES = """
-- A key's pages, newest first (listing.py): the index's own order, from the cursor on.
DROP INDEX IF EXISTS sessions_by_owner;
CREATE INDEX IF NOT EXISTS sessions_by_owner_page ON sessions (owner, created_at, id);
CREATE INDEX IF NOT EXISTS sessions_by_owner_state ON sessions (owner, state, created_at, id);
CREATE INDEX IF NOT EXISTS sessions_by_state ON sessions (state);
CREATE INDEX IF NOT EXISTS sessions_by_end ON sessions (ended_at);
CREATE INDEX IF NOT EXISTS sessions_by_idempotency_key ON sessions (owner, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
_COLUMNS = ("id, owner, backend, state, created_at, expires_at, timeout_s, failure, body, "
            "ended_at, idempotency_key, idempotency_request")
_ENDED = tuple(state.value for state in SessionState if state not in LIVE_STATES)


_Row = tuple[str, str, str, str, str, str | None, int, str | None, str, str | None, str | None,
             str | None]


def _row(record: SessionRecord) -> _Row:
    return (
        record.id,
        record.owner,
        record.backend,
        record.state.value,
        record.created_at.isoformat(),
        record.expires_at.isoformat() if record.expires_at else None,
        record.timeout_s,
        record.failure.model_dump_json() if record.failure else None,
        record.body.model_dump_json(exclude_defaults=True),
        record.ended_at.isoformat() if record.ended_at else None,
        record.idempotency.key if record.idempotency else None,
        record.idempotency.request if record.idempotency else None,
    )


def _record(row: sqlite3.Row | Mapping[str, Any]) -> SessionRecord:
    return SessionRecord(
        id=row["id"],
        owner=row["owner"],
        backend=row["backend"],
        body=SessionCreate.model_validate_json(row["body"]),
        timeout_s=row["timeout_s"],
        state=SessionState(row["state"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        expires_at=datetime.fromisoformat(row["expires_at"]) if row["expires_at"] else None,
        failure=Failure.model_validate_json(row["failure"]) if row["failure"] else None,
        # A fleet's record written by a server of before the column has none.
        ended_at=(datetime.fromisoformat(ended)
                  if "ended_at" in row.keys() and (ended := row["ended_at"]) else None),
        idempotency=(Idempotency(key, row["idempotency_request"])
                     if "idempotency_key" in row.keys() and (key := row["idempotency_key"])
                     else None),
    )


def record_json(record: SessionRecord) -> str:
    """A record as the JSON a fleet shares (shared_registry.py): the registry's columns."""
    return json.dumps(dict(zip(_COLUMNS.split(", "), _row(record), strict=True)))


def record_from_json(text: str) -> SessionRecord:
    """ValueError (pydantic's ValidationError is one) unless ``text`` is a record's JSON."""
    try:
        fields = json.loads(text)
        return _record(fields)
    except (KeyError, TypeError) as error:
        raise ValueError(f"not a session record: {error!r}") from None


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a registry of an older server up to this one's columns."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(sessions)")}
    if "ended_at" not in columns:
        # When its sessions ended was not kept: they count as ended now, so each is kept
        # for the whole ENDED_SESSION_TTL_H from the upgrade.
        db.execute("ALTER TABLE sessions ADD COLUMN ended_at TEXT")
        marks = ", ".join("?" for _ in _ENDED)
        db.execute(f"UPDATE sessions SET ended_at = ? WHERE state IN ({marks})",
                   (datetime.now(UTC).isoformat(), *_ENDED))
    for column in ("idempotency_key", "idempotency_request"):
        if column not in columns:  # sessions made before had none
            db.execute(f"ALTER TABLE sessions ADD COLUMN {column} TEXT")


class Registry:
    # Whether other servers share these records (SharedRegistry): sessions then move
    # between servers, and what only one server can hold is refused.
    shared = False

    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, functools.partial(fn, *args, **kwargs))
        except sqlite3.OperationalError as error:
            # A write the disk refuses for another reason than room (a quota's EDQUOT, a
            # file size limit's EFBIG, EIO) is SQLite's I/O error: to the session as to a
            # full disk, a record it cannot keep (its end must still remove its sandbox).
            code = error.sqlite_errorcode
            if code == sqlite3.SQLITE_FULL:
                raise InsufficientStorage(
                    "no room on the server's disk: the session registry cannot be written "
                    f"({error})") from None
            if code & 0xFF == sqlite3.SQLITE_IOERR:
                raise InsufficientStorage(
                    f"the server's disk refused a write of the session registry ({error}: "
                    "a quota, a file size limit or a failing disk)") from None
            raise

    @property
    def db(self) -> sqlite3.Connection:
        assert self._db is not None, "the registry is not open"
        return self._db

    # -- on the registry thread -----------------------------------------------------------

    def _open(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self._path, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        _migrate(db)
        db.executescript(_INDEXES)
        self._db = db

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _save(self, row: _Row) -> None:
        marks = ", ".join("?" for _ in row)
        self.db.execute(f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES ({marks})", row)

    def _forget_ended(self, before: datetime) -> int:
        return self.db.execute(
            "DELETE FROM sessions WHERE ended_at < ?", (before.isoformat(),)
        ).rowcount

    def _get(self, session_id: str) -> SessionRecord | None:
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return _record(row) if row is not None else None

    def _by_idempotency_key(self, owner: str, key: str) -> SessionRecord | None:
        row = self.db.execute(
            f"SELECT {_COLUMNS} FROM sessions WHERE owner = ? AND idempotency_key = ? "
            "ORDER BY created_at DESC LIMIT 1", (owner, key),
        ).fetchone()
        return _record(row) if row is not None else None

    def _page(self, query: SessionQuery) -> tuple[list[SessionRecord], bool]:
        where, args = ["owner = ?"], [query.owner]
        for key, value in (query.labels or {}).items():
            # json_each compares the decoded key and value: no escaping of either.
            where.append("EXISTS (SELECT 1 FROM json_each(body, '$.labels') "
                         "WHERE key = ? AND type = 'text' AND value = ?)")
            args += [key, value]
        if query.after is not None:
            when, session_id = query.after
            where.append("(created_at, id) < (?, ?)")
            args += [when.isoformat(), session_id]
        select = f"SELECT {_COLUMNS} FROM sessions WHERE {' AND '.join(where)}"
        if query.states:
            # One ordered walk of (owner, state, created_at, id) per state, merged: with
            # `state IN (...)` SQLite walks all of the key's sessions, ended ones included.
            states = sorted(state.value for state in query.states)
            sql = " UNION ALL ".join(f"{select} AND state = ?" for _ in states)
            args = [value for state in states for value in (*args, state)]
        else:
            sql = select
        rows = self.db.execute(
            f"{sql} ORDER BY created_at DESC, id DESC LIMIT ?", [*args, query.limit + 1]
        ).fetchall()
        return [_record(row) for row in rows[:query.limit]], len(rows) > query.limit

    def _live(self) -> list[SessionRecord]:
        marks = ", ".join("?" for _ in LIVE_STATES)
        rows = self.db.execute(
            f"SELECT {_COLUMNS} FROM sessions WHERE state IN ({marks})",
            [state.value for state in LIVE_STATES],
        ).fetchall()
        return [_record(row) for row in rows]

    def _count_by_state(self) -> dict[SessionState, int]:
        rows = self.db.execute("SELECT state, COUNT(*) FROM sessions GROUP BY state").fetchall()
        return {SessionState(state): count for state, count in rows}

    # -- from the event loop --------------------------------------------------------------

    async def open(self) -> None:
        await self._call(self._open)

    async def close(self) -> None:
        await self._call(self._close)
        self._executor.shutdown(wait=True)

    async def save(self, record: SessionRecord) -> None:
        # Serialised here, on the loop, so the thread never sees a record being changed.
        await self._call(self._save, _row(record))

    async def get(self, session_id: str) -> SessionRecord | None:
        return await self._call(self._get, session_id)

    async def by_idempotency_key(self, owner: str, key: str) -> SessionRecord | None:
        """The session ``owner`` created with the ``Idempotency-Key`` ``key``, if kept."""
        return await self._call(self._by_idempotency_key, owner, key)

    async def page(self, query: SessionQuery) -> tuple[list[SessionRecord], bool]:
        """The sessions ``query`` asks for, newest first, and whether more follow."""
        return await self._call(self._page, query)

    async def forget_ended(self, before: datetime) -> int:
        """Delete the records of sessions that ended before ``before``; how many."""
        return await self._call(self._forget_ended, before)

    async def live(self) -> list[SessionRecord]:
        """Sessions the registry believes are live (after a restart: left over)."""
        return await self._call(self._live)

    async def count_by_state(self) -> dict[SessionState, int]:
        return await self._call(self._count_by_state)
