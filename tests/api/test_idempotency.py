"""``Idempotency-Key`` on ``POST /v1/sessions``: a retried create answers the session the
first one made, never a second desktop.

Real sessions (local engine) on the API suite's server, real HTTP; the registry's columns
and the fleet's lookup on a real SQLite file and the fleet's in-memory table (a seam of
ours, tests/fleet_table.py).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox import Deskbox
from deskbox_server.schemas.sessions import SessionCreate
from deskbox_server.sessions.idempotency import idempotency_of
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.registry import Registry
from deskbox_server.sessions.shared_registry import SharedRegistry

from ..fleet_table import FleetTable
from .conftest import KEY_A, KEY_B, Server
from .helpers import assert_error

REPLAYED = "Idempotent-Replayed"


@pytest.fixture
def label() -> Iterator[dict[str, str]]:
    """A label of this test's own, so that its sessions can be counted."""
    yield {"idem": uuid.uuid4().hex[:12]}


def _create(http: httpx.Client, key: str, body: dict[str, Any], wait: bool = True
            ) -> httpx.Response:
    params = {} if wait else {"wait": "false"}
    return http.post("/v1/sessions", json=body, params=params,
                     headers={"Idempotency-Key": key})


def _ids_with(http: httpx.Client, label: dict[str, str]) -> list[str]:
    (k, v), = label.items()
    answer = http.get("/v1/sessions", params={"label": f"{k}:{v}"})
    assert answer.status_code == 200, answer.text
    return [s["id"] for s in answer.json()["sessions"]]


def test_a_retried_create_answers_the_first_session(server: Server, label: dict[str, str]
                                                     ) -> None:
    key = f"retry-{uuid.uuid4()}"
    with server.client() as http, server.client(KEY_B) as other:
        first = _create(http, key, {"labels": label})
        assert first.status_code == 201, first.text
        assert REPLAYED not in first.headers
        session_id = first.json()["id"]
        try:
            # The same request spelled otherwise (a default written out, labels reordered).
            again = _create(http, key, {"record": False, "labels": dict(reversed(label.items()))})
            assert again.status_code == 201, again.text
            assert again.headers[REPLAYED] == "true"
            assert again.json()["id"] == session_id
            assert again.json()["state"] == "running"
            assert _ids_with(http, label) == [session_id]

            changed = _create(http, key, {"labels": {**label, "extra": "1"}})
            assert_error(changed, 422, "invalid_request")
            assert "Idempotency-Key" in changed.json()["error"]["message"]
            assert session_id in changed.json()["error"]["message"]
            assert _ids_with(http, label) == [session_id]

            # Keys are the API key's own: another key's create with it makes its own.
            theirs = _create(other, key, {"labels": label})
            assert theirs.status_code == 201, theirs.text
            assert REPLAYED not in theirs.headers and theirs.json()["id"] != session_id
            assert other.delete(f"/v1/sessions/{theirs.json()['id']}").status_code == 204
        finally:
            assert http.delete(f"/v1/sessions/{session_id}").status_code == 204
        # Kept with the session: a retry after its end says what became of it.
        late = _create(http, key, {"labels": label})
        assert late.status_code == 201 and late.headers[REPLAYED] == "true"
        assert (late.json()["id"], late.json()["state"]) == (session_id, "stopped")


def test_creates_racing_with_one_key_make_one_session(server: Server, label: dict[str, str]
                                                      ) -> None:
    key = f"race-{uuid.uuid4()}"
    with server.client() as http, ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: _create(http, key, {"labels": label}), range(3)))
        try:
            assert [a.status_code for a in answers] == [201, 201, 201], [a.text for a in answers]
            assert len({a.json()["id"] for a in answers}) == 1
            assert sorted(a.headers.get(REPLAYED, "") for a in answers) == ["", "true", "true"]
            assert all(a.json()["state"] == "running" for a in answers)
            assert _ids_with(http, label) == [answers[0].json()["id"]]
        finally:
            for session_id in {a.json().get("id") for a in answers} - {None}:
                http.delete(f"/v1/sessions/{session_id}")


def test_a_retry_that_waits_waits_for_the_first_sessions_start(
    server: Server, label: dict[str, str],
) -> None:
    key = f"wait-{uuid.uuid4()}"
    with server.client() as http:
        first = _create(http, key, {"labels": label}, wait=False)
        assert first.status_code == 201 and first.json()["state"] == "starting", first.text
        try:
            again = _create(http, key, {"labels": label})
            assert again.status_code == 201 and again.headers[REPLAYED] == "true"
            assert (again.json()["id"], again.json()["state"]) == (first.json()["id"], "running")
        finally:
            http.delete(f"/v1/sessions/{first.json()['id']}")


@pytest.mark.parametrize("bad", ["", "x" * 256, "has space", "tab\there"])
def test_a_bad_key_is_refused(server: Server, bad: str) -> None:
    with server.client() as http:
        answer = _create(http, bad, {})
        assert_error(answer, 422, "invalid_request")
        assert "Idempotency-Key" in answer.json()["error"]["message"]


def test_the_sdk_sends_the_key(server: Server, label: dict[str, str]) -> None:
    key = f"sdk-{uuid.uuid4()}"
    with Deskbox(server.url, api_key=KEY_A) as box:
        first = box.sessions.create(labels=label, idempotency_key=key)
        try:
            assert box.sessions.create(labels=label, idempotency_key=key).id == first.id
            assert [s.id for s in box.sessions.list(labels=label)] == [first.id]
        finally:
            first.close()


def test_the_registry_keeps_the_key_and_gains_its_columns(tmp_path: Path) -> None:
    database = tmp_path / "sessions.sqlite3"
    older = sqlite3.connect(database)  # a registry of the server before the key
    older.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT NOT NULL, backend TEXT NOT NULL,"
        " state TEXT NOT NULL, created_at TEXT NOT NULL, expires_at TEXT, timeout_s INTEGER NOT"
        " NULL, failure TEXT, body TEXT NOT NULL, ended_at TEXT);")
    older.execute("INSERT INTO sessions VALUES ('ses_old', 'owner', 'local', 'running', "
                  "'2026-12-01T00:00:00+00:00', NULL, 900, NULL, '{}', NULL)")
    older.commit()
    older.close()
    wanted = idempotency_of("k1", SessionCreate())

    async def check(registry: Registry, migrated: bool) -> None:
        await registry.open()
        try:
            record = SessionRecord(id="ses_new", owner="owner", backend="local",
                                   body=SessionCreate(), timeout_s=900, idempotency=wanted)
            await registry.save(record)
            found = await registry.by_idempotency_key("owner", "k1")
            assert found is not None and (found.id, found.idempotency) == ("ses_new", wanted)
            assert await registry.by_idempotency_key("someone else", "k1") is None
            assert await registry.by_idempotency_key("owner", "k2") is None
            if migrated:
                old = await registry.get("ses_old")
                assert old is not None and old.idempotency is None
        finally:
            await registry.close()

    asyncio.run(check(Registry(database), migrated=True))
    asyncio.run(check(SharedRegistry(tmp_path / "fleet.sqlite3", FleetTable()), migrated=False))
