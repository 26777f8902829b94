"""Ended sessions are kept for ``ENDED_SESSION_TTL_H`` after their ``ended_at``, then
forgotten; a registry written by an older server (no ``ended_at`` column) is brought up to
date and its ended sessions kept for the whole time from the upgrade.

A real server on a registry seeded before it starts: by hand with the old schema, then
through the server's Registry class.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deskbox_server.api.auth import key_id
from deskbox_server.schemas.sessions import SessionCreate, SessionState
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.registry import Registry
from deskbox_server.settings import Settings

from .conftest import KEY_A, running_server
from .helpers import assert_error

# The registry as servers before ended_at wrote it.
_OLD_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, backend TEXT NOT NULL, state TEXT NOT NULL,
    created_at TEXT NOT NULL, expires_at TEXT, timeout_s INTEGER NOT NULL, failure TEXT,
    body TEXT NOT NULL
);
CREATE INDEX sessions_by_owner ON sessions (owner, created_at);
"""


def _seed(state_dir: Path) -> None:
    now = datetime.now(UTC)
    database = state_dir / "sessions.sqlite3"
    old = sqlite3.connect(database)
    old.executescript(_OLD_SCHEMA)
    old.execute("INSERT INTO sessions VALUES (?, ?, 'local', 'stopped', ?, NULL, 900, NULL, '{}')",
                ("ses_before_upgrade", key_id(KEY_A), (now - timedelta(days=30)).isoformat()))
    old.commit()
    old.close()

    def ended(session_id: str, hours_ago: float) -> SessionRecord:
        return SessionRecord(
            id=session_id, owner=key_id(KEY_A), backend="local", body=SessionCreate(),
            timeout_s=900, state=SessionState.stopped, created_at=now - timedelta(days=3),
            ended_at=now - timedelta(hours=hours_ago))

    async def seed() -> None:
        registry = Registry(database)
        await registry.open()  # migrates
        await registry.save(ended("ses_ended_long_ago", 2.0))
        await registry.save(ended("ses_ended_lately", 0.5))
        await registry.close()

    asyncio.run(seed())


def test_ended_sessions_are_forgotten_after_their_time(tmp_path: Path) -> None:
    _seed(tmp_path)
    settings = Settings(state_dir=tmp_path, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", ended_session_ttl_h=1.0,
                        reaper_interval_s=0.1)
    with running_server(settings) as server, server.client() as http:
        deadline = time.monotonic() + 20
        while http.get("/v1/sessions/ses_ended_long_ago").status_code != 404:
            assert time.monotonic() < deadline, "a session ended 2 h ago is still kept"
            time.sleep(0.05)
        assert_error(http.get("/v1/sessions/ses_ended_long_ago"), 404, "not_found")
        listed = [s["id"] for s in http.get("/v1/sessions").json()["sessions"]]
        assert listed == ["ses_ended_lately", "ses_before_upgrade"]

        lately = http.get("/v1/sessions/ses_ended_lately").json()
        assert lately["state"] == "stopped"
        ended_at = datetime.fromisoformat(lately["ended_at"])
        assert timedelta(minutes=29) < datetime.now(UTC) - ended_at < timedelta(minutes=31)
        # Its end was not written down: the upgrade counts as its end.
        upgraded = http.get("/v1/sessions/ses_before_upgrade").json()
        assert abs(datetime.now(UTC) - datetime.fromisoformat(upgraded["ended_at"])) < \
            timedelta(minutes=5)

        # A session's own end, through the API.
        created = http.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
        assert created.status_code == 201, created.text
        session = created.json()
        assert session["state"] == "running" and session["ended_at"] is None
        before = datetime.now(UTC)
        assert http.delete(f"/v1/sessions/{session['id']}").status_code == 204
        stopped = http.get(f"/v1/sessions/{session['id']}").json()
        assert stopped["state"] == "stopped"
        assert before - timedelta(seconds=1) <= datetime.fromisoformat(stopped["ended_at"]) \
            <= datetime.now(UTC)
