"""``GET /v1/sessions`` over a key that ran thousands of sessions: pages, newest first;
``GET /v1/recordings`` likewise.

The registry and the recordings are seeded before the server starts (the server's own
Registry and RecordingStore classes), as if the key had run 2,600 sessions over a few days
and recorded 250 of them; a real server answers over HTTP, and the SDK walks the pages.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from deskbox import Deskbox
from deskbox_server.api.auth import key_id
from deskbox_server.schemas.sessions import Failure, SessionCreate, SessionState
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.recording_store import RecordingMeta, RecordingStore
from deskbox_server.sessions.registry import Registry
from deskbox_server.settings import Settings

from ..clients.test_cli import deskbox
from .conftest import KEY_A, KEY_B, Server, running_server
from .helpers import assert_error

ENDED = 2600
RECORDED = 250
ODD_LABEL = ('team "blue".eu', "Ñandú/1")  # quotes, a dot, a slash, non-ASCII
START = datetime(2026, 11, 1, tzinfo=UTC)


def _seeded() -> list[SessionRecord]:
    records = []
    for n in range(ENDED):
        labels = {"run": str(n % 3)}
        if n % 100 == 7:
            labels[ODD_LABEL[0]] = ODD_LABEL[1]
        failed = n % 5 == 0
        records.append(SessionRecord(
            id=f"ses_seed{n:05d}", owner=key_id(KEY_A), backend="local",
            body=SessionCreate(labels=labels), timeout_s=900,
            state=SessionState.failed if failed else SessionState.stopped,
            # One in ten made in the same microsecond as the one before: ids break ties.
            created_at=START + timedelta(minutes=n - 1 if n % 10 == 1 else n),
            failure=Failure(reason="seeded", at=START) if failed else None,
        ))
    return records


def _recording(record: SessionRecord) -> RecordingMeta:
    return RecordingMeta(
        session_id=record.id, owner=record.owner, state="stopped",
        started_at=record.created_at, stopped_at=record.created_at,
        stop_reason="the session ended", expires_at=datetime.now(UTC) + timedelta(days=7),
        frames=1, actions=2, bytes=3)


@pytest.fixture(scope="module")
def listed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state_dir: Path = tmp_path_factory.mktemp("listing")

    async def seed() -> None:
        registry = Registry(state_dir / "sessions.sqlite3")
        await registry.open()
        for record in _seeded():
            await registry.save(record)
        await registry.close()

    asyncio.run(seed())
    recordings = RecordingStore(state_dir / "recordings", timedelta(days=7))
    recordings.open()
    for record in _seeded()[:RECORDED]:
        recordings.directory(record.id).mkdir()
        recordings.save(_recording(record))
    settings = Settings(state_dir=state_dir, api_keys=[KEY_A, KEY_B], max_sessions=0,
                        backends=["local"], default_backend="local")
    with running_server(settings) as server:
        yield server


def _walk(http: httpx.Client, **params: object) -> tuple[list[str], int]:
    """Every id the pages hold, in their order, and how many pages there were."""
    ids: list[str] = []
    pages = 0
    cursor = None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = http.get("/v1/sessions", params=query)  # type: ignore[arg-type]
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"sessions", "next_cursor"}
        ids += [s["id"] for s in body["sessions"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return ids, pages


def _newest_first(records: list[SessionRecord]) -> list[str]:
    return [r.id for r in sorted(records, key=lambda r: (r.created_at, r.id), reverse=True)]


def test_pages_walk_every_session_once_newest_first(listed_server: Server) -> None:
    seeded = _seeded()
    with listed_server.client() as http:
        first = http.get("/v1/sessions").json()
        assert len(first["sessions"]) == 100 and first["next_cursor"]
        assert [s["id"] for s in first["sessions"]] == _newest_first(seeded)[:100]
        # An entry of a page is the session's resource, as GET of its id answers it.
        entry = first["sessions"][3]
        assert http.get(f"/v1/sessions/{entry['id']}").json() == entry

        ids, pages = _walk(http, limit=1000)
        assert ids == _newest_first(seeded) and pages == 3

        failed, _ = _walk(http, state="failed", limit=170)
        assert failed == _newest_first([r for r in seeded if r.state is SessionState.failed])
        both, _ = _walk(http, state=["failed", "stopped"], limit=999)
        assert both == ids
        assert _walk(http, state="running")[0] == []

        odd, _ = _walk(http, label=f"{ODD_LABEL[0]}:{ODD_LABEL[1]}", limit=7)
        assert odd == _newest_first([r for r in seeded if ODD_LABEL[0] in r.body.labels])
        assert len(odd) == ENDED // 100
        runs, _ = _walk(http, label=["run:2", f"{ODD_LABEL[0]}:{ODD_LABEL[1]}"], limit=5)
        assert runs == [i for i in odd if int(i.removeprefix("ses_seed")) % 3 == 2]
        assert _walk(http, label=f"{ODD_LABEL[0]}:{ODD_LABEL[1][:-1]}")[0] == []
    with listed_server.client(KEY_B) as other:
        assert other.get("/v1/sessions").json() == {"sessions": [], "next_cursor": None}


def test_a_cursor_names_a_place_not_a_session(listed_server: Server) -> None:
    with listed_server.client() as http:
        page = http.get("/v1/sessions", params={"limit": 10}).json()
        cursor = page["next_cursor"]
        following = http.get("/v1/sessions", params={"limit": 10, "cursor": cursor}).json()
        # Deleting the session a cursor was made from changes nothing for the next page.
        assert http.delete(f"/v1/sessions/{page['sessions'][-1]['id']}").status_code == 204
        again = http.get("/v1/sessions", params={"limit": 10, "cursor": cursor}).json()
        assert again == following
        assert {s["id"] for s in page["sessions"]}.isdisjoint(
            s["id"] for s in following["sessions"])


def test_bad_paging_is_a_clear_422(listed_server: Server) -> None:
    with listed_server.client() as http:
        year_one = base64.urlsafe_b64encode(b"0001-01-01T00:00:00+05:00 ses_x").decode()
        for params in ({"cursor": "not-a-cursor"}, {"cursor": "bm90IGEgZGF0ZQ"},
                       {"cursor": year_one}, {"cursor": "é"},
                       {"cursor": "x" * 600}, {"limit": 0}, {"limit": 1001},
                       {"limit": "many"}, {"state": ["running", "dancing"]},
                       {"label": [f"k{n}:v" for n in range(65)]}):
            error = assert_error(http.get("/v1/sessions", params=params), 422,
                                 "invalid_request")
            assert next(iter(params)) in error["message"], error
        # As many filters as a session may have labels, in every state: "none match".
        many = http.get("/v1/sessions", params={
            "label": [f"k{n}:v" for n in range(64)], "state": [s.value for s in SessionState]})
        assert many.status_code == 200 and many.json()["sessions"] == []


def test_the_sdk_lists_every_page(listed_server: Server) -> None:
    with Deskbox(base_url=listed_server.url, api_key=KEY_A) as box:
        sessions = box.sessions.list()
        assert [s.id for s in sessions] == _newest_first(_seeded())
        assert [s.id for s in box.sessions.list(limit=1500)] == _newest_first(_seeded())[:1500]
        with pytest.raises(ValueError, match="limit must be 1 or more"):
            box.sessions.list(limit=0)
        failed = box.sessions.list(state="failed", labels={"run": "1"})
        assert [s.id for s in failed] == _newest_first([
            r for r in _seeded()
            if r.state is SessionState.failed and r.body.labels["run"] == "1"])


def test_recordings_come_in_pages_too(listed_server: Server) -> None:
    newest_first = _newest_first(_seeded()[:RECORDED])
    with listed_server.client() as http:
        ids: list[str] = []
        cursor = None
        while True:
            page = http.get("/v1/recordings", params={
                "limit": 100, **({"cursor": cursor} if cursor else {})}).json()
            assert set(page) == {"recordings", "next_cursor"}
            ids += [r["session_id"] for r in page["recordings"]]
            if (cursor := page["next_cursor"]) is None:
                break
        assert ids == newest_first
        first = http.get("/v1/recordings").json()
        assert [r["session_id"] for r in first["recordings"]] == newest_first[:100]
        assert_error(http.get("/v1/recordings", params={"cursor": "nope"}), 422,
                     "invalid_request")
        assert_error(http.get("/v1/recordings", params={"limit": 1001}), 422,
                     "invalid_request")
    with listed_server.client(KEY_B) as other:
        assert other.get("/v1/recordings").json() == {"recordings": [], "next_cursor": None}


def test_deskbox_ls_shows_the_newest(listed_server: Server) -> None:
    listed = deskbox(listed_server, "ls", "--limit", "3", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [s["id"] for s in json.loads(listed.stdout)] == _newest_first(_seeded())[:3]
