"""A server killed outright and started again on its state dir: what still runs is re-adopted.

The servers run as ``deskbox serve`` subprocesses (SIGKILL is the point). Their sandboxes'
inits reparent to this process (a subreaper, see tests/conftest.py) when a server dies; the
test reaps them once the second server has destroyed them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest

from deskbox_server.engines.runc import freezer
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.settings import Settings

from .helpers import decode, events_until
from .sandbox_page import SandboxPage, events_data_url, read_display_number
from .served import KEY, container_of, init_of, reap, remove_sandboxes, runc_session, serve
from .test_container import RED, cgroup_dirs, mounts_mentioning, running

pytestmark = pytest.mark.slow


def create(http: httpx.Client) -> tuple[str, int]:
    """A session on the events page: its id and its sandbox init's pid."""
    return runc_session(http, {"browser": {"start_url": events_data_url()}})


class Load(threading.Thread):
    """Clicks and screenshots on a session, one after the other, until the server dies."""

    def __init__(self, base_url: str, session_id: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.session_id = base_url, session_id
        self.count = 0
        self.ended = threading.Event()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.base_url, timeout=30,
                              headers={"Authorization": f"Bearer {KEY}"}) as http:
                while True:
                    response = http.post(f"/v1/sessions/{self.session_id}/actions", json={
                        "actions": [{"type": "click", "x": 640, "y": 700}],
                        "screenshot": {"format": "jpeg"}})
                    assert response.status_code == 200, response.text
                    self.count += 1
        except httpx.TransportError:
            pass  # the server was killed
        finally:
            self.ended.set()

    def wait(self, timeout_s: float) -> bool:
        return self.ended.wait(timeout_s)


def under_load(http: httpx.Client, session_id: str) -> Load:
    load = Load(str(http.base_url), session_id)
    load.start()
    deadline = time.monotonic() + 30
    while load.count < 3:
        assert not load.ended.is_set() and time.monotonic() < deadline, "no load"
        time.sleep(0.05)
    return load


def display_of(number: int, state_dir: Path, servers: tuple[int, ...]) -> list[str]:
    """What is left of display ``number`` that is a session's of ``state_dir`` (the host's
    symlink to its socket) or a reservation of one of ``servers`` (the X lock's pid)."""
    left = []
    link = Path(f"/tmp/.X11-unix/X{number}")
    if link.is_symlink() and os.readlink(link).startswith(str(state_dir)):
        left.append(str(link))
    lock = Path(f"/tmp/.X{number}-lock")
    with contextlib.suppress(OSError, ValueError):
        if int(lock.read_text().strip()) in servers:
            left.append(str(lock))
    return left


def test_restart_readopts_running_sessions(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    log = tmp_path / "server.log"
    runc = Runc()
    with serve(state_dir, log) as (first, http):
        (kept, kept_init), (lost, lost_init) = create(http), create(http)
        inits = [kept_init, lost_init]
        kept_container, lost_container = container_of(kept), container_of(lost)
        # Killed under load: actions in flight on one session, another one starting.
        acted = under_load(http, kept)
        starting = http.post("/v1/sessions", params={"wait": "false"}, json={})
        assert starting.status_code == 201 and starting.json()["state"] == "starting"
        time.sleep(0.3)
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert acted.wait(30) and acted.count > 0
    try:
        # While no server runs: one sandbox dies, and a stray directory appears.
        os.kill(inits[1], signal.SIGKILL)
        reap(inits[1:])
        stray = state_dir / "sessions" / "ses_stray"
        stray.mkdir()
        kept_dir = state_dir / "sessions" / kept
        number = read_display_number(kept_dir)
        os.unlink(f"/tmp/.X11-unix/X{number}")  # as if /tmp had been cleaned meanwhile

        with serve(state_dir, log) as (second, http):
            body = http.get(f"/v1/sessions/{kept}").json()
            assert body["state"] == "running", body
            failed = http.get(f"/v1/sessions/{lost}").json()
            assert failed["state"] == "failed", failed
            assert "not running" in failed["failure"]["reason"]
            assert not stray.exists()
            assert runc.state(lost_container) is None
            half = http.get(f"/v1/sessions/{starting.json()['id']}").json()
            assert half["state"] == "failed", half
            assert "while the session was starting" in half["failure"]["reason"]
            assert not [c for c in runc.list_ids() if c.endswith(starting.json()["id"])]
            listed = {s["id"]: s["state"] for s in http.get("/v1/sessions").json()["sessions"]}
            assert listed == {kept: "running", lost: "failed",
                              starting.json()["id"]: "failed"}

            # The re-adopted session still works: input lands, screenshots show the page.
            with SandboxPage(http, kept) as page:
                before = page.wait(lambda state: True)["clicks"]  # the load's, at the kill
                response = http.post(f"/v1/sessions/{kept}/actions",
                                     json={"type": "click", "x": 640, "y": 700})
                assert response.status_code == 200, response.text
                landed = page.wait(lambda state: state["clicks"] == before + 1)
                assert landed["clicks"] == before + 1, (before, landed)
                click = landed["click"]
                assert (click[2], click[3]) == (640, 700)
                ox, oy = click[2] - click[0], click[3] - click[1]
            shot = http.get(f"/v1/sessions/{kept}/screenshot", params={"format": "png"})
            assert shot.status_code == 200
            assert decode(shot.content).getpixel((ox + 200, oy + 150)) == RED

            pids = [int(pid) for directory in cgroup_dirs(kept_container)
                    for pid in (directory / "cgroup.procs").read_text().split()
                    if (directory / "cgroup.procs").exists()]
            assert pids
            assert http.delete(f"/v1/sessions/{kept}").status_code == 204
            assert http.delete(f"/v1/sessions/{lost}").status_code == 204
            assert http.delete(f"/v1/sessions/{starting.json()['id']}").status_code == 204
            assert http.get(f"/v1/sessions/{kept}").json()["state"] == "stopped"
            second.terminate()
            assert second.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises it
            assert "deskbox stopped every session" in log.read_text()
        reap(inits[:1])
        assert not [pid for pid in pids if running(pid)]
        assert runc.state(kept_container) is None
        assert not cgroup_dirs(kept_container)
        assert not mounts_mentioning(str(state_dir))
        assert not mounts_mentioning(kept_container)
        assert not list((state_dir / "sessions").iterdir())
        # The number is free again for the next session of the host, which another test's
        # server may take at once: none of this session's is left under it.
        assert not display_of(number, state_dir, (first.pid, second.pid))
    finally:
        remove_sandboxes(state_dir, inits)


def test_a_pause_cut_short_by_a_killed_server_leaves_the_session_running(
    tmp_path: Path,
) -> None:
    """SIGKILL between a pause's freeze and its record: the registry still says running, the
    sandbox is frozen. The next server thaws it and takes it over; it waited 5 s for the
    frozen agent and failed the session with a reason that did not say why."""
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    with serve(state_dir, log) as (first, http):
        session, init = create(http)
        container = container_of(session)
        freezer.freeze(container)  # as the pause's last step does
        first.send_signal(signal.SIGKILL)
        first.wait()
    try:
        with serve(state_dir, log) as (second, http):
            again = http.get(f"/v1/sessions/{session}").json()
            assert again["state"] == "running", again
            assert not freezer.frozen(container)
            click = http.post(f"/v1/sessions/{session}/actions",
                              json={"type": "click", "x": 5, "y": 5})
            assert click.status_code == 200, click.text
            assert "thawing a sandbox frozen by a pause" in log.read_text()
            assert http.delete(f"/v1/sessions/{session}").status_code == 204
    finally:
        reap([init])


def test_a_session_in_use_outlives_a_restart(tmp_path: Path) -> None:
    """Its use moved its idle clock in the killed server's memory only: the next server
    re-adopted it with the clock saved at its start, and its first reaper pass stopped
    the session as expired while it was in use."""
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    inits: list[int] = []
    try:
        with serve(state_dir, log, {"DESKBOX_REAPER_INTERVAL_S": "0.5"}) as (first, http):
            sid, init = runc_session(http, {"timeout_s": 6})
            inits.append(init)
            for _ in range(8):  # 8 s in use: past the clock saved at its start
                moved = http.post(f"/v1/sessions/{sid}/actions", json={"type": "move",
                                                                       "x": 5, "y": 5})
                assert moved.status_code == 200, moved.text
                time.sleep(1)
            first.send_signal(signal.SIGKILL)
            first.wait()
        with serve(state_dir, log, {"DESKBOX_REAPER_INTERVAL_S": "0.5"}) as (_, http):
            time.sleep(2)  # a few reaper passes
            body = http.get(f"/v1/sessions/{sid}").json()
            assert body["state"] == "running", body
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    finally:
        remove_sandboxes(state_dir, inits)


def test_an_event_stream_resumed_on_the_next_server_gets_what_happens_after(
    tmp_path: Path,
) -> None:
    """A client follows a session's events, its server is killed, and it reconnects to the
    next server with the Last-Event-ID it last saw: the re-adopted session's stop comes
    through. Ids counted from 1 in each server process were all at or below it, and the
    stream ended with nothing."""
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    inits: list[int] = []
    try:
        with serve(state_dir, log) as (first, http):
            sid, init = runc_session(http)
            inits.append(init)
            seen = events_until(http, sid, lambda event: event.get("state") == "running")
            first.send_signal(signal.SIGKILL)
            first.wait()
        last = seen[-1]["id"]
        with serve(state_dir, log) as (_, http):
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "running"
            with http.stream("GET", f"/v1/sessions/{sid}/events", timeout=20,
                             headers={"Last-Event-ID": str(last)}) as stream:
                assert stream.status_code == 200
                assert http.delete(f"/v1/sessions/{sid}").status_code == 204
                lines = list(stream.iter_lines())  # until the stream ends with the session
        ids = [int(line[len("id: "):]) for line in lines if line.startswith("id: ")]
        events = [json.loads(line[len("data: "):]) for line in lines
                  if line.startswith("data: ")]
        states = [event["state"] for event in events if event["type"] == "state"]
        assert states == ["stopping", "stopped"], (last, lines)
        assert ids == [event["id"] for event in events]
        assert last < ids[0] and ids == sorted(set(ids)), (last, ids)
    finally:
        remove_sandboxes(state_dir, inits)


def test_a_hibernation_the_killed_server_did_not_record_is_kept(tmp_path: Path) -> None:
    """Killed between a hibernate's dump and the save of its new state (or that save
    refused for a full disk): the registry says running, the sandbox no longer runs, and
    its checkpoint is whole. The next server failed the session and removed that
    checkpoint; now the session is hibernated, and resumes."""
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    inits: list[int] = []
    try:
        with serve(state_dir, log) as (first, http):
            sid, _ = create(http)
            paused = http.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"},
                               timeout=120)
            assert paused.status_code == 200, paused.text
            first.send_signal(signal.SIGKILL)
            first.wait()
        # What the registry held had the kill come before the save of 'hibernated'.
        with sqlite3.connect(Settings(state_dir=state_dir).database_path) as registry:
            registry.execute("UPDATE sessions SET state = 'running' WHERE id = ?", (sid,))
        with serve(state_dir, log) as (_, http):
            body = http.get(f"/v1/sessions/{sid}").json()
            assert body["state"] == "hibernated", body
            resumed = http.post(f"/v1/sessions/{sid}/resume", timeout=120)
            assert resumed.status_code == 200, resumed.text
            inits.append(init_of(sid))
            shot = http.get(f"/v1/sessions/{sid}/screenshot")
            assert shot.status_code == 200, shot.text
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    finally:
        remove_sandboxes(state_dir, inits)
