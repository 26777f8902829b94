"""Pause mode "freeze" end to end, on a runc sandbox: the cgroup freezer stops the whole
desktop; every way of acting on it answers 409 ``conflict``; the screenshot is the last
frame, flagged; resume brings back the same page, which takes input again; a paused
session survives the reaper and can be deleted.
"""

from __future__ import annotations

import json
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image, ImageChops
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deskbox_server.api.auth import key_id
from deskbox_server.engines.desktop_commands import DEVTOOLS_PORT
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.sessions import state_changes
from deskbox_server.sessions.desktop import AnyDesktop

from ..impostors import run
from .conftest import DISPLAY, KEY_A, Server
from .containers import (
    act,
    container_server,
    open_session,
    page_origin,
    sandbox_handle,
    sandbox_page,
)
from .helpers import assert_error, decode, events_until
from .sandbox_page import SandboxPage, events_data_url
from .test_container import cgroup_dirs, cgroup_pids, running

pytestmark = pytest.mark.slow

TEXT = "typed before the pause"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "pause", reaper_interval_s=0.2) as running_:
        yield running_


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


def new_session(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post(
        "/v1/sessions",
        json={"display": DISPLAY, "browser": {"start_url": events_data_url()}, **body},
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    with open_session(client) as body:
        yield body


@pytest.fixture(scope="module")
def handle(server: Server, session: dict[str, Any]) -> AnyDesktop:
    return sandbox_handle(server, session)


@pytest.fixture(scope="module")
def page(client: httpx.Client, session: dict[str, Any]) -> Iterator[SandboxPage]:
    with sandbox_page(client, session) as page:
        yield page


@pytest.fixture(scope="module")
def origin(client: httpx.Client, session: dict[str, Any], page: SandboxPage) -> tuple[int, int]:
    return page_origin(client, session, page)


def changed_pixels(first: Image.Image, second: Image.Image) -> int:
    assert first.size == second.size
    diff = ImageChops.difference(first, second).convert("L").point(lambda v: 255 if v else 0)
    return int(sum(diff.histogram()[255:]))


def freezer_state(container_id: str) -> str:
    return Path(f"/sys/fs/cgroup/freezer/{container_id}/freezer.state").read_text().strip()


def test_freeze_refuses_actions_and_serves_the_last_frame(
    client: httpx.Client, session: dict[str, Any], handle: AnyDesktop,
    page: SandboxPage, origin: tuple[int, int],
) -> None:
    sid = session["id"]
    ox, oy = origin
    field = {"type": "click", "x": ox + 900, "y": oy + 175}
    act(client, session, {"actions": [field, {"type": "type", "text": TEXT}]})
    page.wait(lambda state: state["value"] == TEXT)
    clicks = page.wait(lambda state: True)["clicks"]
    before = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
    assert before.status_code == 200 and "x-deskbox-frozen" not in before.headers

    paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["state"] == "paused"
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    container_id = handle.sandbox.container_id
    assert freezer_state(container_id) == "FROZEN"
    state = Runc().state(container_id)
    assert state is not None and state.status == "paused"
    # Pausing again changes nothing.
    assert client.post(f"/v1/sessions/{sid}/pause", json={}).json()["state"] == "paused"

    # Every way of acting answers 409 with the error body, without reaching the desktop.
    click = {"type": "click", "x": ox + 150, "y": oy + 150}
    error = assert_error(client.post(f"/v1/sessions/{sid}/actions", json=click), 409, "conflict")
    assert "paused" in error["message"] and "resume" in error["message"]
    assert_error(client.post(f"/v1/sessions/{sid}/actions/anthropic",
                             json={"action": "left_click", "coordinate": [10, 10]}),
                 409, "conflict")
    assert_error(client.post(f"/v1/sessions/{sid}/exec", json={"cmd": ["true"]}), 409, "conflict")
    assert_error(client.get(f"/v1/sessions/{sid}/files", params={"path": "/etc/hostname"}),
                 409, "conflict")
    assert_error(client.get(f"/v1/sessions/{sid}/view/clipboard"), 409, "conflict")
    assert_error(client.post(f"/v1/sessions/{sid}/view/clipboard", json={"text": "x"}),
                 409, "conflict")
    assert_error(client.post(f"/v1/sessions/{sid}/view/type", json={"text": "x"}),
                 409, "conflict")
    with pytest.raises(InvalidStatus) as denied:
        connect(session["urls"]["actions_ws"], open_timeout=10,
                additional_headers={"Authorization": f"Bearer {KEY_A}"})
    assert denied.value.response.status_code == 409

    # The screenshot is the frame captured at pause time, and says so.
    frozen = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
    assert frozen.status_code == 200, frozen.text
    assert frozen.headers["x-deskbox-frozen"] == "true"
    # The same frame every time, and the screen as it was (but for the blinking caret).
    again = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
    assert decode(again.content).tobytes() == decode(frozen.content).tobytes()
    assert changed_pixels(decode(frozen.content), decode(before.content)) <= 40
    small = client.get(f"/v1/sessions/{sid}/screenshot",
                       params={"format": "jpeg", "scale": "640x400"})
    assert small.status_code == 200 and small.headers["x-deskbox-frozen"] == "true"
    assert decode(small.content).size == (640, 400)

    # Idle sessions are reaped; a paused one is neither reaped early nor failed.
    time.sleep(1.0)
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    assert client.post(f"/v1/sessions/{sid}/keepalive").status_code == 200

    resumed = client.post(f"/v1/sessions/{sid}/resume")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["state"] == "running"
    assert freezer_state(container_id) == "THAWED"
    assert client.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"

    # The page is the one we left, and takes input again.
    assert page.wait(lambda state: True)["value"] == TEXT
    act(client, session, click)
    landed = page.wait(lambda state: state["clicks"] > clicks)
    assert landed["click"][:2] == [150, 150]
    after = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
    assert "x-deskbox-frozen" not in after.headers


def test_pause_waits_for_actions_in_flight(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["id"]
    done: list[float] = []

    def slow_action() -> None:
        act(client, session, {"type": "wait", "ms": 1500})
        done.append(time.monotonic())

    thread = threading.Thread(target=slow_action)
    thread.start()
    time.sleep(0.5)  # the action has reached the desktop (it runs for 1.5 s)
    asked = time.monotonic()
    response = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
    waited = time.monotonic() - asked
    thread.join()
    assert response.status_code == 200, response.text
    assert done, "the action in flight failed"  # act() asserted its 200
    assert waited >= 0.5, waited  # the pause waited for the rest of the 1.5 s action
    assert client.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"


def _pause_behind_a_wait(
    client: httpx.Client, session: dict[str, Any],
) -> tuple[threading.Thread, threading.Thread, list[httpx.Response]]:
    """A 2.5 s wait in flight, then a freeze asked for, each in a thread of its own: the
    pause waits for the wait. The threads and where the pause's answer lands."""
    waiting = threading.Thread(target=act, args=(client, session, {"type": "wait", "ms": 2500}))
    waiting.start()
    time.sleep(0.3)
    pausing: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: pausing.append(client.post(
        f"/v1/sessions/{session['id']}/pause", json={"mode": "freeze"})))
    asking.start()
    return waiting, asking, pausing


def test_a_pause_that_fails_after_a_keepalive_lists_the_session_running(
    client: httpx.Client, session: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A keepalive during the pause's wait for an action in flight saved the session as
    paused; the pause then failed (the action outlasted the wait) and the session ran on,
    but the listing, read from the registry, left it out of ``state=running``."""
    monkeypatch.setattr(state_changes, "DRAIN_TIMEOUT_S", 0.5)
    sid = session["id"]
    waiting, asking, pausing = _pause_behind_a_wait(client, session)
    time.sleep(0.2)
    assert client.post(f"/v1/sessions/{sid}/keepalive").status_code == 200
    asking.join(30)
    waiting.join(30)
    assert_error(pausing[0], 409, "conflict")
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "running"
    listed = client.get("/v1/sessions", params={"state": "running"}).json()["sessions"]
    assert sid in [s["id"] for s in listed], listed


def test_the_listing_says_what_get_says_while_a_pause_waits(
    client: httpx.Client, session: dict[str, Any],
) -> None:
    """A pause changes the session's state first, then waits for the action in flight; the
    registry hears of it once it is done. Meanwhile GET said paused, but the listing, read
    from the registry, said running, and ``state=paused`` left the session out."""
    sid = session["id"]

    def listed(*states: str) -> dict[str, str]:
        params = {"state": list(states)} if states else None
        sessions = client.get("/v1/sessions", params=params).json()["sessions"]
        return {s["id"]: s["state"] for s in sessions}

    waiting, asking, pausing = _pause_behind_a_wait(client, session)
    try:
        time.sleep(0.3)  # the pause waits for the action (2 s more)
        assert client.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
        assert listed().get(sid) == "paused"
        assert listed("paused").get(sid) == "paused"
        assert sid not in listed("running")
        assert listed("running", "paused").get(sid) == "paused"
    finally:
        asking.join(30)
        waiting.join(30)
    assert pausing[0].status_code == 200, pausing[0].text
    assert listed("paused").get(sid) == "paused"
    assert client.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
    assert listed().get(sid) == "running"


def sh(client: httpx.Client, sid: str, script: str) -> str:
    done = run(client, sid, "sh", "-c", script)
    assert done["exit_code"] == 0, done
    stdout: str = done["stdout"]
    return stdout


def devtools_connections(client: httpx.Client, sid: str) -> int:
    """Established TCP connections to the sandbox's browser's DevTools port."""
    port = f":{DEVTOOLS_PORT:04X}"
    rows = [line.split() for line in sh(client, sid, "cat /proc/net/tcp").splitlines()[1:]]
    return sum(1 for row in rows if row[1].endswith(port) and row[3] == "01")


def test_a_pause_does_not_wait_for_a_browser_that_stopped_answering(
    client: httpx.Client,
) -> None:
    """The server watches each browser through a DevTools connection, which a pause lets
    go before it freezes the sandbox. It drops it: a closing handshake would wait for a
    browser that may never answer (here stopped; it gets 1 s)."""
    sid = new_session(client)["id"]
    try:
        deadline = time.monotonic() + 10
        while devtools_connections(client, sid) < 1:  # the server's watch is connected
            assert time.monotonic() < deadline, "the server never watched the browser"
            time.sleep(0.1)
        sh(client, sid, "kill -STOP $(pidof chromium)")
        started = time.monotonic()
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
        took = time.monotonic() - started
        assert paused.status_code == 200 and paused.json()["state"] == "paused", paused.text
        assert took < 0.9, took  # a handshake waited for would take its whole 1 s
        assert client.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
        sh(client, sid, "kill -CONT $(pidof chromium)")
        # The browser carries on, watched again.
        deadline = time.monotonic() + 10
        while devtools_connections(client, sid) < 1:
            assert time.monotonic() < deadline, "the server did not watch the browser again"
            time.sleep(0.1)
        with SandboxPage(client, sid) as page:
            clicks = page.wait(lambda state: True)["clicks"]
            act(client, {"id": sid}, {"type": "click", "x": 640, "y": 700})
            page.wait(lambda state: state["clicks"] > clicks)
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_delete_of_a_paused_session_leaves_nothing(client: httpx.Client, server: Server) -> None:
    body = new_session(client)
    sid = body["id"]
    try:
        found = server.services.manager.handle(key_id(KEY_A), sid)
        assert isinstance(found.sandbox, RuncSandbox)
        container_id = found.sandbox.container_id
        pids = cgroup_pids(container_id)
        assert len(pids) >= 3
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
        assert paused.status_code == 200, paused.text
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "stopped"
    assert Runc().state(container_id) is None
    assert not [pid for pid in pids if running(pid)]
    assert not cgroup_dirs(container_id)


def runc(*args: str) -> None:
    done = subprocess.run([*Runc().command(), *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_sandbox_frozen_outside_the_server_is_refused_until_resumed(
    client: httpx.Client, server: Server
) -> None:
    """`runc pause` of a session's sandbox, not through the API. An action then in flight
    is answered 409 once the reaper saw the freeze, not at its 30 s deadline (where it had
    failed the session); calls are answered 409 at once with the reason; `runc resume`, and
    the session goes on; frozen again and deleted, nothing of it is left."""
    sid = new_session(client)["id"]
    try:
        container_id = sandbox_handle(server, {"id": sid}).sandbox.container_id
        runc("pause", container_id)
        sent = time.monotonic()
        in_flight = client.post(f"/v1/sessions/{sid}/actions", json={"type": "cursor_position"})
        assert time.monotonic() - sent < 5  # the freezer is read at most every second
        assert_error(in_flight, 409, "conflict")
        started = time.monotonic()
        for refused in (
            client.get(f"/v1/sessions/{sid}/screenshot"),
            client.post(f"/v1/sessions/{sid}/exec", json={"cmd": ["true"]}),
            client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"}),
        ):
            error = assert_error(refused, 409, "conflict")
            assert f"the sandbox {container_id} was frozen outside Deskbox" in error["message"]
        assert time.monotonic() - started < 3  # at once, not at a call's deadline
        assert client.get(f"/v1/sessions/{sid}").json()["state"] == "running"
        runc("resume", container_id)
        deadline = time.monotonic() + 10
        while (shot := client.get(f"/v1/sessions/{sid}/screenshot")).status_code == 409:
            assert time.monotonic() < deadline, shot.text
            time.sleep(0.2)
        assert shot.status_code == 200, shot.text
        assert sh(client, sid, "echo on") == "on\n"
        held, released = events_until(client, sid, "sandbox_released")[-2:]
        assert held["type"] == "sandbox_held", held
        assert f"the sandbox {container_id} was frozen outside Deskbox" in held["reason"]
        assert released["type"] == "sandbox_released", released
        # The server's own pause and resume are not someone else's.
        assert client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"}).json()[
            "state"] == "paused"
        time.sleep(1.5)  # the reaper looks every 0.2 s, the freezer read every 1 s
        assert client.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
        assert sh(client, sid, "echo again") == "again\n"
        since = events_until(client, sid, "sandbox_released")[-1]["id"]
        after = events_until(client, sid, lambda event: event.get("state") == "running",
                             since=since)
        assert [event.get("state") or event["type"] for event in after] == ["paused", "running"]
        runc("pause", container_id)
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "stopped"
    assert Runc().state(container_id) is None
    assert not cgroup_dirs(container_id)


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_hibernate_frees_the_sandbox_and_resume_restores_it(
    client: httpx.Client, server: Server
) -> None:
    """Typed text, the screen and input survive hibernate; the sandbox's cgroup is gone
    meanwhile. No test X connection may be open during the dump (CRIU refuses a sandbox
    that a host process is connected to), so the page is read before and after only."""
    sid = new_session(client)["id"]
    try:
        found = server.services.manager.handle(key_id(KEY_A), sid)
        assert isinstance(found.sandbox, RuncSandbox)
        sandbox = found.sandbox
        container_id = sandbox.container_id
        with SandboxPage(client, sid) as page:
            page.wait(lambda state: state["clicks"] == 0)
            act(client, {"id": sid}, {"type": "click", "x": 640, "y": 700})
            click = page.wait(lambda state: state["clicks"] >= 1)["click"]
            ox, oy = click[2] - click[0], click[3] - click[1]
            act(client, {"id": sid}, {"actions": [
                {"type": "click", "x": ox + 900, "y": oy + 175},
                {"type": "type", "text": TEXT},
            ]})
            assert page.wait(lambda state: state["value"] == TEXT)["value"] == TEXT
        before = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})

        response = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "hibernated"
        assert Runc().state(container_id) is None
        assert not cgroup_dirs(container_id)  # every process ended, the memory is free
        archive = sandbox.hibernate_archive
        assert stat.S_IMODE(archive.stat().st_mode) == 0o600
        click = {"type": "click", "x": ox + 150, "y": oy + 150}
        error = assert_error(client.post(f"/v1/sessions/{sid}/actions", json=click),
                             409, "conflict")
        assert "hibernated" in error["message"]
        frozen = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
        assert frozen.headers["x-deskbox-frozen"] == "true"
        # The screen as it was when it was dumped (but for the blinking caret).
        assert changed_pixels(decode(frozen.content), decode(before.content)) <= 40

        response = client.post(f"/v1/sessions/{sid}/resume")
        assert response.status_code == 200, response.text
        assert response.json()["state"] == "running"
        assert not archive.exists()
        after = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
        assert "x-deskbox-frozen" not in after.headers
        # The same screen, but for the text caret, which blinks on.
        assert changed_pixels(decode(before.content), decode(after.content)) <= 40
        with SandboxPage(client, sid) as page:
            state = page.wait(lambda state: True)
            assert state["value"] == TEXT
            act(client, {"id": sid}, click)
            landed = page.wait(lambda s: s["clicks"] > state["clicks"])
            assert landed["click"][:2] == [150, 150]
        assert_error(client.post(f"/v1/sessions/{sid}/pause", json={"mode": "nap"}),
                     422, "invalid_request")
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert Runc().state(container_id) is None


def test_a_recording_goes_on_through_freeze_hibernate_and_a_snapshot(
    client: httpx.Client,
) -> None:
    """The frames' watch leads into the sandbox: it stops for every pause and checkpoint
    (CRIU would refuse a connection from the host) and starts again after each."""
    session = new_session(client, record=True)
    sid = session["id"]
    snapshot = None
    try:
        for mode in ("freeze", "hibernate", None):
            if mode is None:
                made = client.post(f"/v1/sessions/{sid}/snapshots", timeout=120)
                assert made.status_code == 201, made.text
                snapshot = made.json()["id"]
            else:
                paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": mode},
                                     timeout=120)
                assert paused.status_code == 200, paused.text
                assert client.post(f"/v1/sessions/{sid}/resume", timeout=120
                                   ).status_code == 200
            typed = client.post(f"/v1/sessions/{sid}/actions", json={
                "type": "type", "text": f"after {mode or 'snapshot'}"})
            assert typed.status_code == 200, typed.text
        deadline = time.monotonic() + 10
        while True:
            lines = client.get(f"/v1/sessions/{sid}/trajectory").text.splitlines()
            entries = [json.loads(line) for line in lines]
            last_action = [e for e in entries if e["kind"] == "action"][-1]
            if last_action["frame_after"] != last_action["frame_before"] or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.2)
        states = [e["event"].get("state") for e in entries if e["kind"] == "event"]
        assert states == [None, "paused", "running", "hibernated", "running"], states
        actions = [e for e in entries if e["kind"] == "action"]
        assert len(actions) == 3
        # Each resume (and the snapshot) gave the watch back: the typing after it is seen.
        for action in actions:
            assert action["frame_after"] is not None, action
            assert action["frame_after"] != action["frame_before"], action
    finally:
        client.delete(f"/v1/sessions/{sid}")
        if snapshot is not None:
            client.delete(f"/v1/snapshots/{snapshot}")


def test_a_screenshot_of_a_paused_session_is_recorded(client: httpx.Client) -> None:
    """``GET /screenshot`` is recorded as a screenshot action, and so are the refused
    actions of a paused session; but the frozen frame served while it was paused was
    left out, a look of the agent's missing from its episode."""
    session = new_session(client, record=True)
    sid = session["id"]
    try:
        assert client.get(f"/v1/sessions/{sid}/screenshot").status_code == 200
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"}, timeout=120)
        assert paused.status_code == 200, paused.text
        frozen = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
        assert frozen.status_code == 200 and frozen.headers["X-Deskbox-Frozen"] == "true"
        assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
            "type": "click", "x": 5, "y": 5}), 409, "conflict")
        assert client.post(f"/v1/sessions/{sid}/resume", timeout=120).status_code == 200
        deadline = time.monotonic() + 5
        while True:
            lines = client.get(f"/v1/sessions/{sid}/trajectory").text.splitlines()
            actions = [e for e in map(json.loads, lines) if e["kind"] == "action"]
            if len(actions) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert [(e["action"], "error" in e) for e in actions] == [
            ({"type": "screenshot"}, False), ({"type": "screenshot", "format": "png"}, False),
            ({"type": "click", "x": 5, "y": 5}, True)]
    finally:
        client.delete(f"/v1/sessions/{sid}")
