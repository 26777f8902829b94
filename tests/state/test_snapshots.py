"""Snapshots and forks end to end, on runc sandboxes through the API (issue 6).

A test X connection into a sandbox would make CRIU refuse it (a host process connected to
the sandbox), so the page is read over X before and after a checkpoint, never during one.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from deskbox_server.api.auth import key_id
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.freezer import frozen
from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.scratch import scratch_prefix
from deskbox_server.sessions import snapshots as snapshots_module
from deskbox_server.sessions.desktop import AnyDesktop
from deskbox_server.settings import Settings

from ..api.conftest import DISPLAY, KEY_A, Server, running_server
from ..api.helpers import assert_error, decode
from ..api.sandbox_page import SandboxPage, events_data_url
from ..api.test_container import cgroup_dirs
from ..api.test_container_pause import changed_pixels
from ..images import IMAGE_STATE_DIR
from ..rfb_client import RfbViewer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

TEXT = "typed before the snapshot"


def settings(state_dir: Path, **extra: Any) -> Settings:
    return Settings(
        state_dir=state_dir, api_keys=[KEY_A], image_state_dir=IMAGE_STATE_DIR,
        reaper_interval_s=0.5, max_sessions=8, max_sessions_per_key=6, **extra,
    )


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("snapshots-state")


@pytest.fixture(scope="module")
def server(state_dir: Path) -> Iterator[Server]:
    with running_server(settings(state_dir)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        http.timeout = httpx.Timeout(120)
        yield http


def handle_of(server: Server, session_id: str) -> AnyDesktop:
    found = server.services.manager.handle(key_id(KEY_A), session_id)
    assert isinstance(found.sandbox, RuncSandbox)
    return found


def act(client: httpx.Client, session_id: str, body: dict[str, Any]) -> None:
    response = client.post(f"/v1/sessions/{session_id}/actions", json=body)
    assert response.status_code == 200, response.text


def page_state(client: httpx.Client, session_id: str, done: Any = lambda state: True) -> Any:
    with SandboxPage(client, session_id) as page:
        return page.wait(done)


def field_origin(client: httpx.Client, server: Server, session_id: str) -> tuple[int, int]:
    """Where the page's (0, 0) is on screen, from one click through the API."""
    with SandboxPage(client, session_id) as page:
        page.wait(lambda state: state["clicks"] == 0)
        act(client, session_id, {"type": "click", "x": 640, "y": 700})
        click = page.wait(lambda state: state["clicks"] >= 1)["click"]
    return click[2] - click[0], click[3] - click[1]


def type_into_field(
    client: httpx.Client, session_id: str, origin: tuple[int, int], text: str
) -> None:
    ox, oy = origin
    act(client, session_id, {"actions": [
        {"type": "click", "x": ox + 900, "y": oy + 175},
        {"type": "key", "keys": "End"},
        {"type": "type", "text": text},
    ]})


def screenshot(client: httpx.Client, session_id: str) -> Any:
    response = client.get(f"/v1/sessions/{session_id}/screenshot", params={"format": "png"})
    assert response.status_code == 200, response.text
    return decode(response.content)


def new_session(client: httpx.Client, **body: Any) -> str:
    response = client.post(
        "/v1/sessions",
        json={"display": DISPLAY, "browser": {"start_url": events_data_url()}, **body},
    )
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


@pytest.fixture(scope="module")
def source(client: httpx.Client, server: Server) -> Iterator[tuple[str, tuple[int, int]]]:
    """A session with TEXT typed into the page's field, and where its page is."""
    session_id = new_session(client)
    try:
        origin = field_origin(client, server, session_id)
        type_into_field(client, session_id, origin, TEXT)
        assert page_state(client, session_id, lambda s: s["value"] == TEXT)["value"] == TEXT
        yield session_id, origin
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def cgroups_seen_inside(client: httpx.Client, session_id: str) -> set[str]:
    """The cgroup paths the session's init and an exec'd process see."""
    response = client.post(f"/v1/sessions/{session_id}/exec",
                           json={"cmd": ["cat", "/proc/1/cgroup", "/proc/self/cgroup"]})
    assert response.status_code == 200, response.text
    assert response.json()["exit_code"] == 0, response.text
    return {line.split(":", 2)[2] for line in response.json()["stdout"].splitlines()}


def host_uid(handle: AnyDesktop) -> int:
    """The uid the host sees for the session's init (its root inside)."""
    pid = handle.sandbox.init_pid
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def netns_inode(handle: AnyDesktop) -> int:
    assert handle.sandbox.init_pid is not None
    return os.stat(f"/proc/{handle.sandbox.init_pid}/ns/net").st_ino


def test_snapshot_leaves_the_session_running_and_restores_as_a_copy(
    client: httpx.Client, server: Server, state_dir: Path,
    source: tuple[str, tuple[int, int]],
) -> None:
    sid, origin = source
    before = screenshot(client, sid)
    # The raw images live in memory until packed: in the engine's scratch directory.
    (scratch,) = Path("/dev/shm").glob(scratch_prefix(state_dir, "images") + "*")
    seen: set[str] = set()
    with watching(lambda: seen.update(p.name for p in scratch.iterdir())):
        response = client.post(f"/v1/sessions/{sid}/snapshots")
    assert response.status_code == 201, response.text
    assert [name[:5] for name in seen] == ["dump-"] and not any(scratch.iterdir()), seen
    snapshot = response.json()
    snap_id = snapshot["id"]
    assert snap_id.startswith("snap_") and snapshot["session_id"] == sid
    assert snapshot["display"] == {**DISPLAY, "dpi": 96} and snapshot["backend"] == "container"
    assert 0 < snapshot["size_bytes"] < snapshot["raw_bytes"]
    assert client.get(f"/v1/snapshots/{snap_id}").json() == snapshot
    assert snap_id in [s["id"] for s in client.get("/v1/snapshots").json()["snapshots"]]

    # Only the server can read it: it holds the session's memory.
    directory = state_dir / "snapshots" / snap_id
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = [path for path in directory.rglob("*") if path.is_file()]
    assert files and all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    assert sorted(path.name for path in directory.iterdir()) == [
        "images.tar.zst", "sandbox.json", "snapshot.json"]  # packed; no raw images left

    # The source ran on through it and still takes input.
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "running"
    type_into_field(client, sid, origin, " source")
    page_state(client, sid, lambda s: s["value"] == TEXT + " source")

    # A restore unpacks the archive there too, for as long as CRIU reads it.
    seen.clear()
    with watching(lambda: seen.update(p.name for p in scratch.iterdir())):
        created = client.post("/v1/sessions",
                              json={"from_snapshot": snap_id, "labels": {"k": "v"}})
    assert created.status_code == 201, created.text
    assert [name[:8] for name in seen] == ["restore-"] and not any(scratch.iterdir()), seen
    copy = created.json()
    try:
        assert copy["state"] == "running" and copy["id"] != sid
        assert copy["display"] == snapshot["display"] and copy["labels"] == {"k": "v"}
        source_handle, copy_handle = handle_of(server, sid), handle_of(server, copy["id"])
        assert copy_handle.sandbox.container_id != source_handle.sandbox.container_id
        assert copy_handle.sandbox.display_name != source_handle.sandbox.display_name
        assert netns_inode(copy_handle) != netns_inode(source_handle)
        # The copy is the session as it was at the snapshot: the typed text, the screen.
        assert page_state(client, copy["id"])["value"] == TEXT
        assert changed_pixels(screenshot(client, copy["id"]), before) <= 40
        # ... and goes its own way.
        type_into_field(client, copy["id"], origin, " copy")
        assert page_state(client, copy["id"], lambda s: s["value"] == TEXT + " copy")
        assert page_state(client, sid)["value"] == TEXT + " source"
    finally:
        assert client.delete(f"/v1/sessions/{copy['id']}").status_code == 204

    # A copy with another display or network than the snapshot's is refused up front.
    assert_error(client.post("/v1/sessions", json={
        "from_snapshot": snap_id, "display": {"width": 800, "height": 600}}),
        422, "invalid_request")
    assert_error(client.post("/v1/sessions", json={
        "from_snapshot": snap_id, "network": {"egress": "all"}}), 422, "invalid_request")

    assert client.delete(f"/v1/snapshots/{snap_id}").status_code == 204
    assert not directory.exists()
    assert_error(client.get(f"/v1/snapshots/{snap_id}"), 404, "not_found")
    assert_error(client.delete(f"/v1/snapshots/{snap_id}"), 404, "not_found")
    assert_error(client.post("/v1/sessions", json={"from_snapshot": snap_id}),
                 404, "not_found")
    assert_error(client.get("/v1/snapshots/..%2F..%2Fetc"), 404, "not_found")


def test_fork_makes_independent_running_copies(
    client: httpx.Client, server: Server, state_dir: Path, source: tuple[str, tuple[int, int]],
) -> None:
    sid, origin = source
    text = page_state(client, sid)["value"]
    # The fork checkpoints in memory, in the server's own scratch directory (/dev/shm).
    (scratch,) = Path("/dev/shm").glob(scratch_prefix(state_dir, "fork") + "*")
    source_id = handle_of(server, sid).sandbox.container_id
    seen: set[str] = set()
    source_frozen: set[bool] = set()

    def look() -> None:
        seen.update(p.name for p in scratch.iterdir())
        source_frozen.add(frozen(source_id))

    with watching(look):
        response = client.post(f"/v1/sessions/{sid}/fork", json={"count": 3})
    assert response.status_code == 201, response.text
    copies = [s["id"] for s in response.json()["sessions"]]
    try:
        assert len(set(copies)) == 3 and sid not in copies
        assert all(s["state"] == "running" for s in response.json()["sessions"])
        assert len(seen) == 1, seen
        # The source kept still while its copies were restored, and runs on after.
        assert True in source_frozen and not frozen(source_id)
        # The checkpoint goes once the copies run (after the answer, which does not wait
        # for it); nothing went to the disk.
        deadline = time.monotonic() + 10
        while any(scratch.iterdir()):
            assert time.monotonic() < deadline, list(scratch.iterdir())
            time.sleep(0.05)
        assert not any((state_dir / "snapshots" / ".forks").glob("*"))
        handles = [handle_of(server, c) for c in [sid, *copies]]
        assert len({h.sandbox.container_id for h in handles}) == 4
        assert len({h.sandbox.display_name for h in handles}) == 4
        assert len({netns_inode(h) for h in handles}) == 4
        # Each copy runs in its own cgroup namespace, rooted at its own new cgroup, and in
        # a user namespace: its root is an unprivileged user of the host, who cannot change
        # the image every session runs.
        for copy in [sid, *copies]:
            assert cgroups_seen_inside(client, copy) == {"/"}
            assert host_uid(handle_of(server, copy)) == SANDBOX_USER_IDS[0]
            response = client.post(f"/v1/sessions/{copy}/exec", json={"cmd": [
                "sh", "-c", "echo evil >> /usr/local/bin/deskbox-session"]})
            assert response.status_code == 200, response.text
            assert response.json()["exit_code"] != 0, response.text
        for index, copy in enumerate(copies):
            assert page_state(client, copy)["value"] == text
            type_into_field(client, copy, origin, f" fork{index}")
        for index, copy in enumerate(copies):
            wanted = f"{text} fork{index}"
            assert page_state(client, copy, lambda s, w=wanted: s["value"] == w)["value"] == wanted
        assert page_state(client, sid)["value"] == text  # the source is untouched

        # Each copy has its own tokens: one made for the source opens nothing of a copy.
        token = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "view"}).json()
        with httpx.Client(base_url=server.url, timeout=30) as anonymous:
            own = anonymous.get(f"/v1/sessions/{sid}/view/status",
                                params={"token": token["token"]})
            other = anonymous.get(f"/v1/sessions/{copies[0]}/view/status",
                                  params={"token": token["token"]})
        assert own.status_code == 200, own.text
        assert other.status_code in (401, 403), other.text
    finally:
        for copy in copies:
            assert client.delete(f"/v1/sessions/{copy}").status_code == 204
    for handle in handles[1:]:
        assert Runc().state(handle.sandbox.container_id) is None
        assert not cgroup_dirs(handle.sandbox.container_id)


@contextmanager
def watching(look: Callable[[], object], every_s: float = 0.005) -> Iterator[None]:
    """Call ``look`` every few milliseconds on a thread while the block runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            look()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def test_a_hibernate_with_no_room_for_its_checkpoint_leaves_the_session_running(
    client: httpx.Client, server: Server,
) -> None:
    """The disk under the session's checkpoint is full (a 64 KiB tmpfs there): the pause
    answers 507, and the session runs on from the images CRIU had dumped, typed text and
    all; with room again it hibernates."""
    session_id = new_session(client)
    full = handle_of(server, session_id).sandbox.session_dir / "hibernate"
    full.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "deskbox-full",
                    str(full)], check=True)
    try:
        origin = field_origin(client, server, session_id)
        type_into_field(client, session_id, origin, TEXT)
        page_state(client, session_id, lambda s: s["value"] == TEXT)
        error = assert_error(
            client.post(f"/v1/sessions/{session_id}/pause", json={"mode": "hibernate"}),
            507, "insufficient_storage")
        assert "no room on the server's disk" in error["message"], error
        assert "No space left on device" in error["message"], error
        assert client.get(f"/v1/sessions/{session_id}").json()["state"] == "running"
        assert page_state(client, session_id)["value"] == TEXT
        type_into_field(client, session_id, origin, " after")
        page_state(client, session_id, lambda s: s["value"] == TEXT + " after")

        subprocess.run(["umount", str(full)], check=True)
        paused = client.post(f"/v1/sessions/{session_id}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200 and paused.json()["state"] == "hibernated", paused.text
        resumed = client.post(f"/v1/sessions/{session_id}/resume")
        assert resumed.status_code == 200, resumed.text
        assert page_state(client, session_id)["value"] == TEXT + " after"
    finally:
        subprocess.run(["umount", str(full)], check=False, capture_output=True)
        client.delete(f"/v1/sessions/{session_id}")


def test_fork_refuses_what_it_cannot_do(
    client: httpx.Client, source: tuple[str, tuple[int, int]]
) -> None:
    sid, _ = source
    for count in (0, 17, "two", "2", True):
        assert_error(client.post(f"/v1/sessions/{sid}/fork", json={"count": count}),
                     422, "invalid_request")
    # 6 per key: the source and 5 more at most.
    error = assert_error(client.post(f"/v1/sessions/{sid}/fork", json={"count": 6}),
                         429, "capacity")
    assert "maximum" in error["message"]
    assert_error(client.post("/v1/sessions/ses_nope/fork", json={"count": 1}),
                 404, "not_found")
    assert_error(client.post("/v1/sessions/ses_nope/snapshots"), 404, "not_found")


def test_a_damaged_snapshot_gives_a_clear_error_and_no_session(
    client: httpx.Client, state_dir: Path, source: tuple[str, tuple[int, int]],
) -> None:
    sid, _ = source
    taken = client.post(f"/v1/sessions/{sid}/snapshots")
    assert taken.status_code == 201, taken.text
    snap_id = taken.json()["id"]
    archive = state_dir / "snapshots" / snap_id / "images.tar.zst"
    with open(archive, "r+b") as file:
        file.truncate(archive.stat().st_size // 2)
    before = {s["id"] for s in client.get("/v1/sessions").json()["sessions"]}
    error = assert_error(client.post("/v1/sessions", json={"from_snapshot": snap_id}),
                         502, "session_failed")
    assert "corrupted" in error["message"], error
    failed = [s for s in client.get("/v1/sessions").json()["sessions"]
              if s["id"] not in before]
    assert [s["state"] for s in failed] == ["failed"]
    assert "corrupted" in failed[0]["failure"]["reason"]
    assert not [cid for cid in Runc().list_ids() if failed[0]["id"] in cid]

    archive.unlink()
    error = assert_error(client.post("/v1/sessions", json={"from_snapshot": snap_id}),
                         502, "session_failed")
    assert "no images" in error["message"], error
    assert client.delete(f"/v1/snapshots/{snap_id}").status_code == 204


def test_snapshots_and_hibernated_sessions_survive_a_server_restart(
    tmp_path: Path,
) -> None:
    state_dir = tmp_path / "state"
    with running_server(settings(state_dir)) as first, first.client() as client:
        client.timeout = httpx.Timeout(120)
        sid = new_session(client)
        origin = field_origin(client, first, sid)
        type_into_field(client, sid, origin, TEXT)
        page_state(client, sid, lambda s: s["value"] == TEXT)
        snap_id = client.post(f"/v1/sessions/{sid}/snapshots").json()["id"]
        before = screenshot(client, sid)
        container_id = handle_of(first, sid).sandbox.container_id
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200, paused.text
    # The server stopped: nothing of the session runs, its checkpoint is on disk.
    assert Runc().state(container_id) is None
    assert not cgroup_dirs(container_id)

    with running_server(settings(state_dir)) as second, second.client() as client:
        client.timeout = httpx.Timeout(120)
        assert client.get(f"/v1/sessions/{sid}").json()["state"] == "hibernated"
        frozen = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
        assert frozen.status_code == 200 and frozen.headers["x-deskbox-frozen"] == "true"
        assert changed_pixels(decode(frozen.content), before) <= 40
        assert client.get(f"/v1/snapshots/{snap_id}").status_code == 200

        resumed = client.post(f"/v1/sessions/{sid}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["state"] == "running"
        assert page_state(client, sid)["value"] == TEXT
        type_into_field(client, sid, origin, " after")
        page_state(client, sid, lambda s: s["value"] == TEXT + " after")

        copy = client.post("/v1/sessions", json={"from_snapshot": snap_id})
        assert copy.status_code == 201, copy.text
        assert page_state(client, copy.json()["id"])["value"] == TEXT
        for session_id in (sid, copy.json()["id"]):
            assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
        assert client.delete(f"/v1/snapshots/{snap_id}").status_code == 204


def test_idle_hibernated_sessions_expire(client: httpx.Client, server: Server) -> None:
    sid = new_session(client, timeout_s=2)
    paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
    assert paused.status_code == 200, paused.text
    session_dir = server.settings.state_dir / "sessions" / sid
    assert (session_dir / "hibernate" / "images.tar.zst").is_file()
    deadline = 30
    started = time.monotonic()
    while (state := client.get(f"/v1/sessions/{sid}").json()["state"]) != "stopped":
        assert state in ("hibernated", "stopping"), state
        assert time.monotonic() - started < deadline, "the hibernated session never expired"
        time.sleep(0.2)
    assert not session_dir.exists()  # its checkpoint went with it


def test_viewers_and_devtools_clients_are_closed_for_a_checkpoint_and_reconnect(
    client: httpx.Client, server: Server,
) -> None:
    """CRIU cannot dump a sandbox a host process is connected to: a VNC viewer and a
    DevTools socket are closed first (and reconnect afterwards) instead of the checkpoint
    being refused."""
    sid = new_session(client)
    session = client.get(f"/v1/sessions/{sid}").json()
    view = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "view"}).json()
    vnc = f"{session['urls']['vnc_ws']}?token={view['token']}"
    target = [t for t in client.get(f"/v1/sessions/{sid}/cdp/json/list").json()
              if t["type"] == "page"][0]

    def evaluate(devtools: ClientConnection, expression: str) -> Any:
        devtools.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {
            "expression": expression, "returnByValue": True}}))
        return json.loads(devtools.recv(timeout=10))["result"]["result"]["value"]

    try:
        for step in ("snapshot", "hibernate", "after"):
            with ExitStack() as stack:
                viewer = stack.enter_context(RfbViewer(vnc))
                devtools = stack.enter_context(connect(
                    target["webSocketDebuggerUrl"], compression=None, open_timeout=10,
                    additional_headers={"Authorization": f"Bearer {KEY_A}"}))
                frame = viewer.full_frame()
                assert frame.shape[:2] == (DISPLAY["height"], DISPLAY["width"])
                assert evaluate(devtools, "document.readyState") == "complete"
                if step == "after":
                    break
                if step == "snapshot":
                    response = client.post(f"/v1/sessions/{sid}/snapshots")
                    assert response.status_code == 201, response.text
                    client.delete(f"/v1/snapshots/{response.json()['id']}")
                else:
                    response = client.post(f"/v1/sessions/{sid}/pause",
                                           json={"mode": "hibernate"})
                    assert response.status_code == 200, response.text
                    assert client.post(f"/v1/sessions/{sid}/resume").status_code == 200
                # Both were closed by the server; the next round connects again.
                with pytest.raises((ConnectionClosed, AssertionError, TimeoutError)):
                    viewer.full_frame()
                with pytest.raises(ConnectionClosed):
                    evaluate(devtools, "1")
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_viewer_connecting_as_a_checkpoint_begins_is_told_to_come_back(
    client: httpx.Client,
) -> None:
    """A viewer still connecting (its session's VNC server starting) when a snapshot begins
    had nothing for the checkpoint to close: the snapshot waited 5 s for it and went on with
    it connected, or the viewer was refused 502 as if the session had failed. Now either it
    connected first and is closed, or it is refused 409 (connect again), and the snapshot
    does not wait for it."""
    sid = new_session(client)
    session = client.get(f"/v1/sessions/{sid}").json()
    view = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "view"}).json()
    vnc = f"{session['urls']['vnc_ws']}?token={view['token']}"
    refused: list[int] = []

    def view_it(outcome: list[object]) -> None:
        try:
            with RfbViewer(vnc) as viewer:
                outcome.append("connected")
                viewer.full_frame()
        except InvalidStatus as error:
            outcome.append(error.response.status_code)
        except (ConnectionClosed, AssertionError, TimeoutError):
            outcome.append("closed")  # connected before the checkpoint, closed by it

    try:
        for delay in (0.0, 0.0, 0.05, 0.1):
            outcome: list[object] = []
            viewer_thread = threading.Thread(target=view_it, args=(outcome,))
            viewer_thread.start()
            time.sleep(delay)
            started = time.monotonic()
            snapshot = client.post(f"/v1/sessions/{sid}/snapshots")
            took = time.monotonic() - started
            viewer_thread.join(timeout=30)
            assert snapshot.status_code == 201, snapshot.text
            client.delete(f"/v1/snapshots/{snapshot.json()['id']}")
            assert outcome and outcome[0] in ("connected", "closed", 409), (delay, outcome)
            assert took < 4, f"the snapshot waited {took:.1f} s for a viewer (delay {delay})"
            refused += [code for code in outcome if code == 409]
            time.sleep(1)  # the last viewer gone, its VNC server stops: the next one starts it
        with RfbViewer(vnc) as viewer:  # and after, viewers connect as before
            assert viewer.full_frame().shape[:2] == (DISPLAY["height"], DISPLAY["width"])
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    print(f"viewers refused 409 while the snapshot began: {len(refused)} of 4")


def test_a_hibernated_session_survives_a_killed_server(tmp_path: Path) -> None:
    """SIGKILL, not a clean stop: the next server still finds and resumes it."""
    from ..api.test_container_restart import serve

    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    with serve(state_dir, log) as (first, http):
        created = http.post("/v1/sessions", json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        paused = http.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"},
                           timeout=120)
        assert paused.status_code == 200, paused.text
        first.send_signal(signal.SIGKILL)
        first.wait()
    with serve(state_dir, log) as (second, http):
        assert http.get(f"/v1/sessions/{sid}").json()["state"] == "hibernated"
        resumed = http.post(f"/v1/sessions/{sid}/resume", timeout=120)
        assert resumed.status_code == 200, resumed.text
        act = http.post(f"/v1/sessions/{sid}/actions", json={"type": "click", "x": 5, "y": 5})
        assert act.status_code == 200, act.text
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204


# 600 MB no compressor shrinks: its hibernate (dump, then zstd) takes seconds.
BALLAST = ("import os, time; b = os.urandom(600 << 20); open('/tmp/ballast', 'w').close(); "
           "time.sleep(1e6)")


def test_a_hibernate_outlasting_the_stops_grace_ends_with_the_session_on_disk(
    tmp_path: Path,
) -> None:
    """SIGTERM while a hibernate runs past DESKBOX_SHUTDOWN_GRACE_S: uvicorn cancels the
    request, and the hibernate goes on until it is done; the next server resumes the
    session. Cancelled with its request, it failed the session and deleted its checkpoint."""
    from ..api.test_container_restart import serve

    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    with serve(state_dir, log, {"DESKBOX_SHUTDOWN_GRACE_S": "1"}) as (first, http):
        created = http.post("/v1/sessions", json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        started = http.post(f"/v1/sessions/{sid}/exec",
                            json={"cmd": ["python3", "-c", BALLAST], "background": True})
        assert started.status_code == 200, started.text
        pid = started.json()["pid"]
        deadline = time.monotonic() + 60
        while http.post(f"/v1/sessions/{sid}/exec", json={
                "cmd": ["test", "-e", "/tmp/ballast"]}).json()["exit_code"] != 0:
            assert time.monotonic() < deadline, "the ballast was never made"
            time.sleep(0.2)

        def hibernate() -> None:
            with suppress(httpx.TransportError):
                http.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"},
                          timeout=120)

        hibernating = threading.Thread(target=hibernate)
        hibernating.start()
        time.sleep(0.3)
        first.send_signal(signal.SIGTERM)
        first.wait(120)
        hibernating.join(30)
    said = log.read_text()
    assert "deskbox stopped every session" in said, said[-3000:]  # a clean stop
    with serve(state_dir, log) as (second, http):
        session = http.get(f"/v1/sessions/{sid}").json()
        assert session["state"] == "hibernated", session
        # It did outlast the grace.
        assert f"hibernate of session {sid} goes on without its caller" in said
        resumed = http.post(f"/v1/sessions/{sid}/resume", timeout=120)
        assert resumed.status_code == 200, resumed.text
        alive = http.post(f"/v1/sessions/{sid}/exec", json={"cmd": ["kill", "-0", str(pid)]})
        assert alive.status_code == 200 and alive.json()["exit_code"] == 0, alive.text
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_resume_cut_short_by_a_killed_server_leaves_the_session_hibernated(
    tmp_path: Path,
) -> None:
    """SIGKILL while a resume restores the sandbox (CRIU has restored it, the server has not
    let it run): the session was never said to run again and its checkpoint is whole, so
    the next server discards the half-restored copy and keeps the session hibernated. It
    lost it, and its checkpoint, before ("… runs: it is no checkpoint")."""
    from ..api.test_container_restart import serve

    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    with serve(state_dir, log) as (first, http):
        created = http.post("/v1/sessions", json={"display": DISPLAY})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        started = http.post(f"/v1/sessions/{sid}/exec",
                            json={"cmd": ["sleep", "1000"], "background": True})
        assert started.status_code == 200, started.text
        pid = started.json()["pid"]
        paused = http.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"},
                           timeout=120)
        assert paused.status_code == 200, paused.text

        def resume() -> None:
            with suppress(httpx.TransportError):
                http.post(f"/v1/sessions/{sid}/resume", timeout=120)

        resuming = threading.Thread(target=resume)
        resuming.start()
        # runc writes the container's state once CRIU has restored it; the server then
        # seals and publishes it (tens of ms) before it lets it run and drops the archive.
        deadline = time.monotonic() + 60
        while not list(Path("/run/runc").glob(f"*-{sid}/state.json")):
            assert time.monotonic() < deadline, "the resume never restored the sandbox"
            time.sleep(0.001)
        first.send_signal(signal.SIGKILL)
        first.wait()
        resuming.join(30)
    archive = state_dir / "sessions" / sid / "hibernate" / "images.tar.zst"
    assert archive.is_file()
    with serve(state_dir, log) as (second, http):
        session = http.get(f"/v1/sessions/{sid}").json()
        assert session["state"] == "hibernated", session
        assert "discarding a restore the previous server did not finish" in log.read_text()
        resumed = http.post(f"/v1/sessions/{sid}/resume", timeout=120)
        assert resumed.status_code == 200, resumed.text
        alive = http.post(f"/v1/sessions/{sid}/exec", json={"cmd": ["kill", "-0", str(pid)]})
        assert alive.status_code == 200 and alive.json()["exit_code"] == 0, alive.text
        assert not list((state_dir / "sessions" / sid).glob("restore-*"))
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204


def _deleted_during(server: Server, http: httpx.Client, sid: str, what: str,
                    body: dict[str, Any] | None, delay_s: float) -> httpx.Response:
    """The answer to ``POST /v1/sessions/{sid}/{what}`` (sent from a client of its own)
    when the session is deleted ``delay_s`` after it was sent."""
    answers: list[httpx.Response] = []

    def post() -> None:
        with server.client() as own:
            own.timeout = httpx.Timeout(120)
            answers.append(own.post(f"/v1/sessions/{sid}/{what}", json=body))

    posting = threading.Thread(target=post)
    posting.start()
    time.sleep(delay_s)
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    posting.join(120)
    [answer] = answers
    return answer


def test_a_delete_during_a_resume_is_a_409_and_leaves_no_sandbox(server: Server) -> None:
    """A hibernated session deleted while it is restored: the resume answers 409 `conflict`
    (200 if it was done first, 404 if the delete came before it), never a 500 for a state
    the session could no longer take, and the session ends stopped with no sandbox left."""
    statuses = []
    for delay_s in (0.15, 0.3, 0.45):
        with server.client() as http:
            http.timeout = httpx.Timeout(120)
            created = http.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            paused = http.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
            assert paused.status_code == 200, paused.text
            answer = _deleted_during(server, http, sid, "resume", None, delay_s)
            statuses.append(answer.status_code)
            if answer.status_code == 404:
                assert_error(answer, 404, "not_found")
            elif answer.status_code != 200:
                message = assert_error(answer, 409, "conflict")["message"]
                assert f"session {sid} was stopp" in message, message
            deadline = time.monotonic() + 30
            while http.get(f"/v1/sessions/{sid}").json()["state"] != "stopped":
                assert time.monotonic() < deadline, http.get(f"/v1/sessions/{sid}").text
                time.sleep(0.1)
            assert not [cid for cid in Runc().list_ids() if cid.endswith("-" + sid)]
    assert 409 in statuses, statuses  # the delete did come during a restore


def _running_ids(http: httpx.Client) -> set[str]:
    listed = http.get("/v1/sessions", params={"state": "running", "limit": 1000}).json()
    return {session["id"] for session in listed["sessions"]}


@pytest.mark.parametrize("what", ["snapshots", "fork"])
def test_a_delete_during_a_checkpoint_is_a_409_and_leaves_no_files(
    server: Server, state_dir: Path, what: str,
) -> None:
    """A session deleted while a snapshot or fork checkpoints it: the checkpoint answers 409
    `conflict` (201 if it was done first), never a 502 about its agent, and nothing of a
    snapshot that was not made stays on disk (it was kept, unlisted, until a restart), nor
    does a copy of a fork whose source went while its copies were restored (they ran on,
    unknown to the caller)."""
    statuses = []
    for delay_s in (0.3, 0.6) if what == "snapshots" else (0.3, 0.6, 0.9, 1.2):
        with server.client() as http:
            http.timeout = httpx.Timeout(120)
            created = http.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            body = {"count": 1} if what == "fork" else None
            before = _running_ids(http)
            answer = _deleted_during(server, http, sid, what, body, delay_s)
            statuses.append(answer.status_code)
            if answer.status_code == 201:  # done before the delete: clean up after it
                made = answer.json()
                for copy in made.get("sessions", []):
                    http.delete(f"/v1/sessions/{copy['id']}")
                if what == "snapshots":
                    http.delete(f"/v1/snapshots/{made['id']}")
            else:
                message = assert_error(answer, 409, "conflict")["message"]
                assert f"session {sid} was deleted while it was checkpointed" in message
                assert _running_ids(http) <= before - {sid}  # no copy left running
        unmade = [entry.name for entry in (state_dir / "snapshots").iterdir()
                  if entry.name.startswith("snap_") and not (entry / "snapshot.json").is_file()]
        assert unmade == []
    assert 409 in statuses, statuses  # the delete did come during a checkpoint


def test_a_keys_snapshots_stop_at_its_quota(tmp_path: Path) -> None:
    """A key's snapshots past DESKBOX_SNAPSHOT_QUOTA_MB: the next is a 429 naming the quota,
    the session runs on, and deleting one makes room again."""
    with running_server(settings(tmp_path, snapshot_quota_mb=1)) as quota_server, \
            quota_server.client() as http:
        created = http.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        try:
            first = http.post(f"/v1/sessions/{sid}/snapshots")
            assert first.status_code == 201, first.text  # the quota was not reached yet
            first_id = first.json()["id"]
            refused = http.post(f"/v1/sessions/{sid}/snapshots")
            message = assert_error(refused, 429, "quota_exceeded")["message"]
            assert "quota is 1 MB (DESKBOX_SNAPSHOT_QUOTA_MB)" in message, message
            assert "retry-after" not in refused.headers  # only a delete frees it
            listed = http.get("/v1/snapshots").json()["snapshots"]
            assert [s["id"] for s in listed] == [first_id]
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "running"

            assert http.delete(f"/v1/snapshots/{first_id}").status_code == 204
            again = http.post(f"/v1/sessions/{sid}/snapshots")
            assert again.status_code == 201, again.text
        finally:
            http.delete(f"/v1/sessions/{sid}")


def _no_room(path: Path, data: bytes) -> None:
    """The snapshot store's writer of record files (sessions/atomic_file.py), which finds
    the disk full."""
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_snapshot_whose_record_finds_no_room_is_a_507_and_leaves_no_files(
    client: httpx.Client, state_dir: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checkpoint is written, then its record finds the disk full: 507, and the
    checkpoint (listed nowhere) is removed at once. Before: a 500, and the checkpoint kept
    under the state dir, listed nowhere, until the server restarted."""
    created = client.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    try:
        before = {entry.name for entry in (state_dir / "snapshots").iterdir()}
        with monkeypatch.context() as patched:
            patched.setattr(snapshots_module, "replace_file", _no_room)
            message = assert_error(client.post(f"/v1/sessions/{sid}/snapshots"), 507,
                                   "insufficient_storage")["message"]
        assert "no room on the server's disk for snapshot" in message, message
        assert {entry.name for entry in (state_dir / "snapshots").iterdir()} == before
        made = client.post(f"/v1/sessions/{sid}/snapshots")  # with room again, it is taken
        assert made.status_code == 201, made.text
        assert client.delete(f"/v1/snapshots/{made.json()['id']}").status_code == 204
    finally:
        client.delete(f"/v1/sessions/{sid}")
