"""A stalled X server (issue 13, section 3): a program inside the session stops its Xvfb
(``kill -STOP``) or holds an X server grab, then the agent acts on it.

Each call into the desktop has a deadline (agent/desktop.py, settle.py): past it the
call fails and the session is ``failed`` with the reason. DELETE and server shutdown kill
the sandbox first, so they never wait on the stuck call. A neighbour session keeps
answering throughout.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines import AnyEngine
from deskbox_server.engines.base import AgentStream, Engine, Sandbox, SessionSpec
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.errors import SessionFailed

from ..api.conftest import DISPLAY, Server
from ..api.containers import container_server
from ..api.helpers import assert_error
from ..api.served import container_of, reap, serve
from ..api.test_container import cgroup_dirs, cgroup_pids, mounts_mentioning, running
from ..api.test_container_cdp import read_events
from .conftest import create
from .test_faults import eventually, exec_in, sandbox_of, still_answers

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 2.0  # the server's desktop_call_timeout_s here (default 30)
STOP_TIMEOUT_S = 3.0  # its stop_timeout_s (default 20)

# Raw X11 (the image has python3, not python-xlib): connection setup, GrabServer (opcode
# 36), then GetInputFocus (43), whose reply means the grab is in force. A child keeps the
# connection (and so the grab) open after the exec returns.
GRABBER = r"""
import os, socket, struct, sys, time
display = os.environ["DISPLAY"].lstrip(":").split(".")[0]
x = socket.socket(socket.AF_UNIX)
x.connect("/tmp/.X11-unix/X" + display)
x.sendall(struct.pack("<BxHHHHxx", 0x6C, 11, 0, 0, 0))
head = x.recv(8)
assert head[0] == 1, head
rest = struct.unpack("<H", head[6:8])[0] * 4
while rest:
    rest -= len(x.recv(rest))
x.sendall(struct.pack("<BxH", 36, 1) + struct.pack("<BxH", 43, 1))
assert len(x.recv(32)) == 32
if os.fork():
    print("grabbed", flush=True)
    os._exit(0)
os.setsid()
devnull = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(devnull, fd)
time.sleep(3600)
"""


def stop_x(client: httpx.Client, session: dict[str, Any]) -> None:
    done = exec_in(client, session, "sh", "-c", "kill -STOP $(pidof Xvfb)")
    assert done["exit_code"] == 0, done


def grab_x(client: httpx.Client, session: dict[str, Any]) -> None:
    done = exec_in(client, session, "python3", "-c", GRABBER)
    assert done["stdout"].strip() == "grabbed", done


STALLS: dict[str, Callable[[httpx.Client, dict[str, Any]], None]] = {
    "stopped": stop_x, "grabbed": grab_x,
}
# Stuck on its first X call, with a deadline far beyond what DELETE may take: typing 1000
# characters may legitimately take 20 s more than the base (settle.py).
LONG_ACTION = {"type": "type", "text": "x" * 1000}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "stall", reaper_interval_s=0.2,
                          desktop_call_timeout_s=CALL_TIMEOUT_S,
                          stop_timeout_s=STOP_TIMEOUT_S) as running:
        yield running


class InFlight(threading.Thread):
    """One request sent on its own client, that the test does not wait for."""

    def __init__(self, client: httpx.Client, method: str, path: str,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(daemon=True)
        self.args = (str(client.base_url), dict(client.headers), method, path, body)
        self.response: httpx.Response | None = None
        self.error: Exception | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        base_url, headers, method, path, body = self.args
        try:
            with httpx.Client(base_url=base_url, headers=headers, timeout=120) as http:
                self.response = http.request(method, path, json=body)
        except httpx.TransportError as error:
            self.error = error
        self.ended_at = time.monotonic()


def leaves_nothing(container_id: str, pids: set[int], session_dir: Path) -> None:
    assert Runc().state(container_id) is None
    assert not cgroup_dirs(container_id)
    assert not [pid for pid in pids if running(pid)]
    assert not session_dir.exists()
    assert not mounts_mentioning(str(session_dir))


# A screenshot runs on the agent's worker thread; a lone click on its event loop, answered
# once its events are written to the X server, whose reply it awaits before the next action:
# a screenshot, and the click after a click, must fail the session at the deadline.
STALLED_CALLS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "screenshot": ("GET", "/screenshot", None),
    "click": ("POST", "/actions", {"actions": [{"type": "click", "x": 10, "y": 10}]}),
}


@pytest.mark.parametrize("call", sorted(STALLED_CALLS))
@pytest.mark.parametrize("stall", sorted(STALLS))
def test_an_action_on_a_stalled_x_server_fails_the_session_within_its_deadline(
    client: httpx.Client, server: Server, session: dict[str, Any],
    neighbour: dict[str, Any], stall: str, call: str,
) -> None:
    container_id = sandbox_of(server, session).sandbox.container_id
    STALLS[stall](client, session)
    method, path, body = STALLED_CALLS[call]
    if call == "click":
        first = client.request(method, f"/v1/sessions/{session['id']}{path}", json=body)
        assert first.status_code == 200, first.text  # the X server has it, to do later
    shot = InFlight(client, method, f"/v1/sessions/{session['id']}{path}", body)
    started = time.monotonic()
    shot.start()
    time.sleep(0.5)
    still_answers(client, neighbour)  # while the stalled call hangs
    shot.join(CALL_TIMEOUT_S + 10)
    assert shot.response is not None and shot.ended_at is not None, shot.error
    took = shot.ended_at - started
    assert CALL_TIMEOUT_S <= took < CALL_TIMEOUT_S + 3, took
    assert shot.response.status_code == 502, shot.response.text
    error = shot.response.json()["error"]
    assert error["type"] == "session_failed" and "did not answer" in error["message"], error

    body = client.get(f"/v1/sessions/{session['id']}").json()
    assert body["state"] == "failed", body
    assert "did not answer within" in body["failure"]["reason"], body
    states = [e for e in read_events(client, session, 100) if e["type"] == "state"]
    assert [e["state"] for e in states] == ["starting", "running", "failed"]
    assert states[-1]["reason"] == body["failure"]["reason"]
    # Later calls fail at once: nothing queues behind the stuck one.
    started = time.monotonic()
    again = client.post(f"/v1/sessions/{session['id']}/actions",
                        json={"type": "click", "x": 1, "y": 1})
    assert again.status_code == 502 and time.monotonic() - started < 1, again.text
    eventually(lambda: Runc().state(container_id) is None, "the sandbox is removed", 5)
    assert not cgroup_pids(container_id)
    still_answers(client, neighbour)


def test_calls_queued_behind_a_long_batch_are_not_cut_short_by_their_wait(
    client: httpx.Client, session: dict[str, Any],
) -> None:
    """Each call's deadline counts from its turn: the second wait and the screenshot behind
    it end well past their own deadlines counted from when they were sent."""
    wait_s = CALL_TIMEOUT_S + 1.0
    path = f"/v1/sessions/{session['id']}"
    waits = [InFlight(client, "POST", f"{path}/actions",
                      {"type": "wait", "ms": int(wait_s * 1000)}) for _ in range(2)]
    started = time.monotonic()
    for waiting in waits:
        waiting.start()
        time.sleep(0.2)  # in this order on the session's line
    shot = client.get(f"{path}/screenshot")
    took = time.monotonic() - started
    for waiting in waits:
        waiting.join(wait_s * 3)
        assert waiting.response is not None, waiting.error
        assert waiting.response.status_code == 200, waiting.response.text
    assert shot.status_code == 200, shot.text
    assert took >= 2 * wait_s, took  # it did wait its turn
    assert client.get(path).json()["state"] == "running"


@pytest.mark.parametrize("stall", sorted(STALLS))
def test_delete_of_a_stalled_session_returns_at_once_and_leaves_nothing(
    client: httpx.Client, server: Server, session: dict[str, Any],
    neighbour: dict[str, Any], stall: str,
) -> None:
    sandbox = sandbox_of(server, session).sandbox
    container_id, session_dir = sandbox.container_id, sandbox.session_dir
    pids = cgroup_pids(container_id)
    STALLS[stall](client, session)
    stuck = InFlight(client, "POST", f"/v1/sessions/{session['id']}/actions", LONG_ACTION)
    stuck.start()
    time.sleep(0.5)
    assert stuck.is_alive()

    started = time.monotonic()
    deleted = client.delete(f"/v1/sessions/{session['id']}")
    took = time.monotonic() - started
    assert deleted.status_code == 204, deleted.text
    assert took < 5, took
    print(f"DELETE of a session whose X server is {stall}: {took:.2f} s")
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "stopped"
    leaves_nothing(container_id, pids, session_dir)
    # The stuck call returned once the sandbox died, with an error.
    stuck.join(5)
    assert stuck.response is not None and stuck.response.status_code != 200, stuck.error
    still_answers(client, neighbour)


def test_shutdown_with_stalled_sessions_completes_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The defaults, but for the deadline: a request stuck on a desktop does not hold the
    # shutdown past shutdown_grace_s, whatever its own deadline.
    monkeypatch.setenv("DESKBOX_DESKTOP_CALL_TIMEOUT_S", "30")
    state_dir = tmp_path / "state"
    runc = Runc()
    inits: list[int] = []
    with serve(state_dir, tmp_path / "server.log") as (process, http):
        sessions = {stall: create(http) for stall in STALLS}
        containers = {stall: container_of(s["id"]) for stall, s in sessions.items()}
        pids = {stall: cgroup_pids(c) for stall, c in containers.items()}
        for container_id in containers.values():
            state = runc.state(container_id)
            assert state is not None
            inits.append(state.pid)
        stuck = []
        for stall, session in sessions.items():
            STALLS[stall](http, session)
            stuck.append(InFlight(http, "POST", f"/v1/sessions/{session['id']}/actions",
                                  LONG_ACTION))
            stuck[-1].start()
        time.sleep(0.5)
        assert all(call.is_alive() for call in stuck)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
        took = time.monotonic() - started
    try:
        print(f"shutdown with a stopped and a grabbed X server: {took:.2f} s")
        assert took < 10, took
        assert code in (0, -signal.SIGTERM)
        assert "deskbox stopped every session" in (tmp_path / "server.log").read_text()
        for stall, container_id in containers.items():
            leaves_nothing(container_id, pids[stall],
                           state_dir / "sessions" / sessions[stall]["id"])
    finally:
        reap(inits)


@pytest.mark.parametrize("change", ["freeze", "hibernate"])
def test_pause_of_a_stalled_session_fails_it_instead_of_hanging(
    client: httpx.Client, server: Server, session: dict[str, Any], change: str,
) -> None:
    """Each grabs the last frame first, from a desktop that does not answer."""
    container_id = sandbox_of(server, session).sandbox.container_id
    stop_x(client, session)
    started = time.monotonic()
    response = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": change})
    took = time.monotonic() - started
    assert response.status_code == 502, response.text
    assert "did not answer" in response.json()["error"]["message"]
    assert took < CALL_TIMEOUT_S + 5, took
    body = client.get(f"/v1/sessions/{session['id']}").json()
    assert body["state"] == "failed" and "did not answer" in body["failure"]["reason"], body
    eventually(lambda: Runc().state(container_id) is None, "the sandbox is removed", 5)


def test_a_snapshot_of_a_session_with_a_stopped_process_is_refused_at_once(
    client: httpx.Client, server: Server, session: dict[str, Any],
) -> None:
    """CRIU cannot dump a stopped task: the snapshot is refused with the reason, and the
    session's own deadline still fails it on its next action."""
    stop_x(client, session)
    started = time.monotonic()
    response = client.post(f"/v1/sessions/{session['id']}/snapshots")
    assert time.monotonic() - started < 5
    error = assert_error(response, 422, "invalid_request")
    assert "is stopped" in error["message"] and "cannot be checkpointed" in error["message"]
    shot = client.get(f"/v1/sessions/{session['id']}/screenshot")
    assert shot.status_code == 502 and "did not answer" in shot.json()["error"]["message"]


def test_the_reaper_stops_an_expired_session_whose_x_server_is_stopped(
    client: httpx.Client, server: Server, neighbour: dict[str, Any],
) -> None:
    response = client.post("/v1/sessions", json={"display": DISPLAY, "timeout_s": 2})
    assert response.status_code == 201, response.text
    session = response.json()
    sandbox = sandbox_of(server, session).sandbox
    container_id, session_dir = sandbox.container_id, sandbox.session_dir
    pids = cgroup_pids(container_id)
    try:
        stop_x(client, session)
        eventually(lambda: client.get(f"/v1/sessions/{session['id']}").json()["state"]
                   == "stopped", "the session is stopped", 2 + 5)
        leaves_nothing(container_id, pids, session_dir)
        still_answers(client, neighbour)
    finally:
        client.delete(f"/v1/sessions/{session['id']}")


class SlowRemoval(Engine[Any]):
    """The session's own engine, whose destroy starts only after ``hold_s``."""

    name = "container"

    def __init__(self, real: AnyEngine, hold_s: float) -> None:
        self.real, self.hold_s = real, hold_s

    async def create(self, spec: SessionSpec, timeout_s: float) -> Sandbox:
        return await self.real.create(spec, timeout_s)

    async def open_stream(self, sandbox: Sandbox, read_limit: int) -> AgentStream:
        return await self.real.open_stream(sandbox, read_limit)

    async def kill(self, sandbox: Sandbox) -> None:
        await self.real.kill(sandbox)

    async def destroy(self, sandbox: Sandbox) -> None:
        await asyncio.sleep(self.hold_s)
        await self.real.destroy(sandbox)


def test_a_removal_that_overruns_fails_the_session_instead_of_leaving_it_stopping(
    client: httpx.Client, server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = create(client)
    desktop = sandbox_of(server, session)
    container_id = desktop.sandbox.container_id
    monkeypatch.setattr(desktop, "engine", SlowRemoval(desktop.engine, STOP_TIMEOUT_S + 2))
    started = time.monotonic()
    deleted = client.delete(f"/v1/sessions/{session['id']}")
    took = time.monotonic() - started
    assert deleted.status_code == 204, deleted.text
    assert STOP_TIMEOUT_S <= took < STOP_TIMEOUT_S + 1.5, took
    body = client.get(f"/v1/sessions/{session['id']}").json()
    assert body["state"] == "failed", body
    assert "not removed within" in body["failure"]["reason"], body
    states = [e for e in read_events(client, session, 100) if e["type"] == "state"]
    assert [e["state"] for e in states] == ["starting", "running", "stopping", "failed"]
    # The removal went on in the background.
    eventually(lambda: Runc().state(container_id) is None, "the sandbox is removed", 10)


def test_a_runc_that_does_not_answer_is_a_session_failure_not_an_escape(
    tmp_path: Path,
) -> None:
    """``subprocess.TimeoutExpired`` is neither SessionFailed nor OSError: it escaped a
    sandbox's removal at its first runc call, which then left the network, mounts and
    files of the sandbox behind, and at a restart aborted the server's recovery."""
    hung = tmp_path / "runc"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    runc = Runc(binary=str(hung))
    started = time.monotonic()
    with pytest.raises(SessionFailed, match=r"^runc delete did not answer within 0.5 s$"):
        runc._run(["delete", "--force", "nothing"], timeout_s=0.5)
    assert time.monotonic() - started < 5


class SlowStart(SlowRemoval):
    """The session's own engine with a start that takes minutes (a VM's boot under
    emulation), which a delete cancels, and whose clean-up of a cancelled start is slow."""

    create_cancellable = True

    def __init__(self, real: AnyEngine, hold_s: float) -> None:
        super().__init__(real, hold_s)
        self.made: list[Sandbox] = []

    async def create(self, spec: SessionSpec, timeout_s: float) -> Sandbox:
        sandbox = await self.real.create(spec, timeout_s)
        self.made.append(sandbox)
        try:
            await asyncio.sleep(120)
        except BaseException:
            await self.destroy(sandbox)  # as the vm engine's _boot_new
            raise
        return sandbox


def test_deletes_of_a_starting_session_let_its_clean_up_finish(
    client: httpx.Client, server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second delete (or the shutdown during a delete) cancelled the start again, inside
    its clean-up: the sandbox was left running for good."""
    manager = server.services.manager
    engine = SlowStart(manager._engines["container"], 1.0)
    monkeypatch.setitem(manager._engines, "container", engine)
    made = client.post("/v1/sessions", params={"wait": "false"}, json={"display": DISPLAY})
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    eventually(lambda: bool(engine.made), "the sandbox is made", 30)
    container_id = engine.made[0].container_id  # type: ignore[attr-defined]
    deletes = [threading.Thread(target=client.delete, args=(f"/v1/sessions/{sid}",))
               for _ in range(2)]
    deletes[0].start()
    time.sleep(0.3)  # the first has cancelled the start, whose clean-up now holds
    deletes[1].start()
    for delete in deletes:
        delete.join(30)
    eventually(lambda: Runc().state(container_id) is None, "the sandbox is removed", 10)
    assert client.get(f"/v1/sessions/{sid}").json()["state"] in ("stopped", "failed")


class FailingRemoval(SlowRemoval):
    """The session's own engine, whose destroy reports a failure (a mount busy, runc not
    answering); here the sandbox is in fact gone, so that the test leaves nothing."""

    def __init__(self, real: AnyEngine) -> None:
        super().__init__(real, 0.0)

    async def destroy(self, sandbox: Sandbox) -> None:
        await self.real.destroy(sandbox)
        raise SessionFailed("runc delete did not answer within 30 s")


def test_a_volume_stays_attached_while_its_sandbox_could_not_be_removed(
    client: httpx.Client, server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its volumes were freed all the same: a new session could mount one for writing
    while the old sandbox, and its mount of it, were still there (two writers of one
    filesystem image)."""
    volume = client.post("/v1/volumes", json={"name": "kept", "size_mb": 16})
    assert volume.status_code == 201, volume.text
    created = client.post("/v1/sessions", json={
        "display": DISPLAY, "volumes": [{"name": "kept", "path": "/root/kept"}]})
    assert created.status_code == 201, created.text
    session = created.json()
    desktop = sandbox_of(server, session)
    monkeypatch.setattr(desktop, "engine", FailingRemoval(desktop.engine))
    assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    body = client.get(f"/v1/sessions/{session['id']}").json()
    assert body["state"] == "failed" and "could not be removed" in body["failure"]["reason"]
    second = client.post("/v1/sessions", json={
        "display": DISPLAY, "volumes": [{"name": "kept", "path": "/root/kept"}]})
    message = assert_error(second, 409, "conflict")["message"]
    assert session["id"] in message, message
