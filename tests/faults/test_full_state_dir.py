"""The server's own disk full (its state directory): writes answer 507, and a delete still
removes the desktop.

Before, every write was a 500 (SQLite's "database or disk is full"), and a delete left the
session stuck in `stopping` with its sandbox running, which the next server adopted again.
A real server (local engine: real Xvfb, Chromium and agent processes) on a state directory
that is a small tmpfs of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.api.auth import key_id
from deskbox_server.schemas.sessions import SessionCreate, SessionState
from deskbox_server.sessions.lifecycle import SessionRecord, utcnow
from deskbox_server.sessions.pool import new_session_id
from deskbox_server.sessions.recording_store import RecordingStore
from deskbox_server.sessions.registry import Registry
from deskbox_server.settings import Settings

from ..api.conftest import DISPLAY, KEY_A, Server, running_server
from ..api.helpers import assert_error, server_log
from ..api.served import serve
from ..images import IMAGE_STATE_DIR
from ..processes import descendants


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "state"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "deskbox-test", mount],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    chunk = b"\0" * (1 << 16)
    with filler.open("wb") as file:
        try:
            while True:
                file.write(chunk)
                file.flush()
        except OSError:
            pass
    return filler


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def _running(server: Server, http: httpx.Client, body: dict[str, Any]) -> tuple[str, list[int]]:
    """A new session of ``body`` and its desktop's processes, all alive."""
    created = http.post("/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    sid = str(created.json()["id"])
    pids = server.handle(sid).sandbox.processes.pids()
    assert pids and all(_alive(pid) for pid in pids)
    return sid, pids


def _delete_and_see_it_removed(http: httpx.Client, sid: str, pids: list[int]) -> None:
    """A delete answers 204, the desktop's processes end and the session says stopped."""
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "the desktop outlived its delete"
        time.sleep(0.1)
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "stopped"


def test_a_full_state_dir_answers_507_and_a_delete_still_removes_the_desktop(
    small_disk: Path,
) -> None:
    settings = Settings(state_dir=small_disk, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", reaper_interval_s=0.2)
    with running_server(settings) as server, server.client() as http:
        sid, pids = _running(server, http, {"display": DISPLAY})

        filler = _fill(small_disk)
        try:
            document = http.get("/openapi.json").json()["paths"]
            for path, answer in (
                ("/v1/sessions/{session_id}/keepalive", http.post(f"/v1/sessions/{sid}/keepalive")),
                ("/v1/sessions", http.post("/v1/sessions", json={"display": DISPLAY})),
            ):
                message = assert_error(answer, 507, "insufficient_storage")["message"]
                assert "no room on the server's disk" in message, message
                assert "507" in document[path]["post"]["responses"], path  # as described
            health = http.get("/healthz")  # an operator's probe sees it
            assert health.status_code == 200 and health.json()["status"] == "degraded"
            assert any(f"the state dir {small_disk} has 0 MiB free" in problem
                       for problem in health.json()["problems"]), health.json()
            # The session itself still answers.
            shot = http.post(f"/v1/sessions/{sid}/actions", json={"type": "screen_size"})
            assert shot.status_code == 200, shot.text

            _delete_and_see_it_removed(http, sid, pids)
            # The listing says so too, though the registry cannot hear of it yet (it still
            # says running): the server's own record is the truth.
            assert [(s["id"], s["state"]) for s in
                    http.get("/v1/sessions").json()["sessions"]] == [(sid, "stopped")]
            assert http.get("/v1/sessions", params={"state": "running"}).json()[
                "sessions"] == []
        finally:
            filler.unlink()
        # Once there is room, the registry takes the end it could not (a reaper pass: read
        # in its file, as the listing shows the server's own record before); the refused
        # create made no session.
        deadline = time.monotonic() + 10
        with contextlib.closing(sqlite3.connect(settings.database_path)) as registry:
            while (saved := registry.execute("SELECT id, state FROM sessions").fetchall()
                   ) != [(sid, "stopped")]:
                assert time.monotonic() < deadline, saved
                time.sleep(0.1)
        listed = [(s["id"], s["state"]) for s in http.get("/v1/sessions").json()["sessions"]]
        assert listed == [(sid, "stopped")], listed


def test_a_recorded_session_on_a_full_state_dir_is_removed_by_its_delete(
    small_disk: Path,
) -> None:
    """Its recording's end cannot be written: the delete still answers 204 and removes the
    desktop. Before, the write's OSError ended the delete with a 500 before the removal,
    and the desktop ran on, held by no session, until the server stopped."""
    settings = Settings(state_dir=small_disk, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", reaper_interval_s=0.2)
    with running_server(settings) as server, server.client() as http:
        sid, pids = _running(server, http, {"display": DISPLAY, "record": True})
        filler = _fill(small_disk)
        try:
            _delete_and_see_it_removed(http, sid, pids)
        finally:
            filler.unlink()


def test_a_start_whose_running_state_cannot_be_saved_fails_the_session(
    small_disk: Path,
) -> None:
    """The disk fills while a session starts: its desktop comes up, its running state
    cannot be written, and the session fails with that reason, its desktop removed.
    Before, it stayed `running` with a start whose error (507) every delete raised again,
    so no delete could remove it."""
    settings = Settings(state_dir=small_disk, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", reaper_interval_s=0.2)
    with running_server(settings) as server, server.client() as http:
        created = http.post("/v1/sessions", params={"wait": "false"}, json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        filler = _fill(small_disk)
        try:
            deadline = time.monotonic() + 60
            while (body := http.get(f"/v1/sessions/{sid}").json())["state"] == "starting":
                assert time.monotonic() < deadline, body
                time.sleep(0.1)
            assert body["state"] == "failed", body
            assert "no room on the server's disk" in body["failure"]["reason"], body
            while server.services.manager.holding:  # its desktop goes, and the session
                assert time.monotonic() < deadline, server.services.manager.holding
                time.sleep(0.1)
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
        finally:
            filler.unlink()


def test_a_registry_the_disk_refuses_otherwise_still_lets_a_delete_remove_the_desktop(
    tmp_path: Path,
) -> None:
    """A write the disk refuses for another reason than room (here a file size limit's
    EFBIG; a quota's EDQUOT and EIO are alike to SQLite: its I/O error). Before, that error
    was not the registry's 507 but a 500 raised at the delete's first save, before the
    removal: the desktop ran on, held by no session, and the next server adopted it as
    running. Now it is 507 as a full disk, a delete still removes the desktop, and its end
    is saved once the disk takes writes again: here by the server's stop (its reaper, which
    would do it too, waits 30 s), so the next server finds the session stopped, not failed
    by the restart."""
    engine = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}
    with serve(tmp_path / "state", tmp_path / "server.log",
               {**engine, "DESKBOX_REAPER_INTERVAL_S": "30"}) as (process, http):
        created = http.post("/v1/sessions", json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        desktop = descendants(process.pid)
        assert desktop and all(_alive(pid) for pid in desktop)
        # Every write of the server past the first 512 bytes of a file fails (EFBIG;
        # CPython ignores SIGXFSZ): the registry's among them, and its log's.
        unlimited = resource.prlimit(process.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (512, unlimited[1]))
        try:
            refused = assert_error(http.post(f"/v1/sessions/{sid}/keepalive"), 507,
                                   "insufficient_storage")
            assert "refused a write of the session registry" in refused["message"], refused
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
            deadline = time.monotonic() + 15
            while alive := [pid for pid in desktop if _alive(pid)]:
                assert time.monotonic() < deadline, f"the desktop outlived its delete: {alive}"
                time.sleep(0.1)
        finally:
            resource.prlimit(process.pid, resource.RLIMIT_FSIZE, unlimited)
    with serve(tmp_path / "state", tmp_path / "server.log", engine) as (_, http):
        assert http.get(f"/v1/sessions/{sid}").json()["state"] == "stopped"


def test_a_server_starts_on_a_full_state_dir_and_saves_what_it_found_later(
    small_disk: Path,
) -> None:
    """A previous server left a session live whose desktop is gone and a recording marked
    `recording` (it was killed, or its last saves met the full disk), and an expired
    recording; the next server starts on the full disk. Before, its start rewrote both
    records, met ENOSPC (the recording's meta.json, the registry's SQLITE_FULL) and did not
    start at all, so the sweep that frees expired recordings never ran. Now it starts,
    says failed and stopped from memory, frees the expired recording, and writes both
    records once there is room (a reaper pass)."""
    settings = Settings(state_dir=small_disk, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", reaper_interval_s=0.2)
    with running_server(settings):  # what a server makes once (its secrets' key…)
        pass
    owner = key_id(KEY_A)
    lost, recorded, expired = (new_session_id() for _ in range(3))
    recordings = RecordingStore(small_disk / "recordings", timedelta(hours=1))
    recordings.open()
    recordings.begin(owner, recorded)
    old = recordings.begin(owner, expired)
    recordings.stopped(old, None)
    old.expires_at = utcnow() - timedelta(minutes=1)
    recordings.save(old)
    # Its engine is not offered here: the session cannot be re-adopted and fails.
    left = SessionRecord(id=lost, owner=owner, backend="container", body=SessionCreate(),
                         timeout_s=300, state=SessionState.running)
    asyncio.run(_saved(settings.database_path, left))
    # A reader holds the registry's WAL index (made while there was room) across the
    # start, as the disk filled under a running server: SQLite then meets the full disk
    # at the write of a record, where the server has its say, not in making that index.
    reader = sqlite3.connect(settings.database_path)
    try:
        reader.execute("SELECT COUNT(*) FROM sessions").fetchone()
        filler = _fill(small_disk)
        try:
            with server_log() as logged, running_server(settings) as server, \
                    server.client() as http:
                # Both writes met the full disk (the recording's is saved at once if the
                # sweep's deletion of the expired one left room).
                said = [record.getMessage() for record in logged]
                for what in (f"session {lost}: its failed state is not saved yet",
                             f"session {recorded}: its stopped state is not saved yet"):
                    assert any(what in line for line in said), (what, said)
                session = http.get(f"/v1/sessions/{lost}").json()
                assert session["state"] == "failed", session
                assert "without the 'container' backend" in session["failure"]["reason"]
                recording = http.get(f"/v1/sessions/{recorded}/recording").json()
                assert recording["state"] == "stopped", recording
                assert recording["stop_reason"] == "the server restarted", recording
                assert recording["expires_at"] is not None, recording
                assert_error(http.get(f"/v1/sessions/{expired}/recording"), 404, "not_found")
                assert not (small_disk / "recordings" / expired).exists()

                filler.unlink()
                meta = small_disk / "recordings" / recorded / "meta.json"
                deadline = time.monotonic() + 10
                # On the disk itself: the listing shows the server's own record meanwhile.
                while (json.loads(meta.read_text())["state"] != "stopped"
                       or reader.execute("SELECT state FROM sessions WHERE id = ?",
                                         (lost,)).fetchall() != [("failed",)]):
                    assert time.monotonic() < deadline, "what was found was never saved"
                    time.sleep(0.1)
                assert [(s["id"], s["state"]) for s in http.get("/v1/sessions").json()[
                    "sessions"]] == [(lost, "failed")]
        finally:
            filler.unlink(missing_ok=True)
    finally:
        reader.close()


async def _saved(path: Path, record: SessionRecord) -> None:
    registry = Registry(path)
    await registry.open()
    try:
        await registry.save(record)
    finally:
        await registry.close()


def _state(http: httpx.Client, sid: str) -> tuple[str, str]:
    """The session's state as GET says and as the listing says."""
    listed = {s["id"]: s["state"] for s in http.get("/v1/sessions").json()["sessions"]}
    return http.get(f"/v1/sessions/{sid}").json()["state"], listed[sid]


@pytest.mark.slow
def test_a_pause_or_resume_whose_state_cannot_be_saved_leaves_the_session_as_it_was(
    small_disk: Path,
) -> None:
    """A freeze, and the resume of one, on a full state dir: the new state cannot be saved,
    the call answers 507 and the session is as it was (API.md), for GET, the listing and
    its actions alike. Before, the refused pause left the sandbox frozen, `paused` for GET
    and `running` in the listing; the refused resume ran it, watched by nothing (no
    browser watch, no recording frames), `running` for GET and `paused` in the listing."""
    settings = Settings(state_dir=small_disk, api_keys=[KEY_A],
                        image_state_dir=IMAGE_STATE_DIR, reaper_interval_s=0.2)
    with running_server(settings) as server, server.client() as http:
        http.timeout = httpx.Timeout(60)
        created = http.post("/v1/sessions", json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        look = {"type": "screen_size"}
        try:
            for call, body, before in (("pause", {"mode": "freeze"}, "running"),
                                       ("resume", None, "paused")):
                filler = _fill(small_disk)
                try:
                    refused = http.post(f"/v1/sessions/{sid}/{call}", json=body)
                    message = assert_error(refused, 507, "insufficient_storage")["message"]
                    assert "no room on the server's disk" in message, message
                    assert _state(http, sid) == (before, before)
                    acted = http.post(f"/v1/sessions/{sid}/actions", json=look)
                    assert acted.status_code == (200 if before == "running" else 409), \
                        acted.text
                finally:
                    filler.unlink()
                done = http.post(f"/v1/sessions/{sid}/{call}", json=body)  # room again
                assert done.status_code == 200, done.text
            assert _state(http, sid) == ("running", "running")
            acted = http.post(f"/v1/sessions/{sid}/actions", json=look)
            assert acted.status_code == 200, acted.text
        finally:
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
