"""Issue 14: every runc sandbox runs deskbox-agent, and the host reaches it over one stream.

The host's stream is closed for every checkpoint (CRIU cannot dump a connection to the
host) and made again after every restore: after hibernate/resume, in each copy of a fork,
in a session made from a snapshot and after a server restart. ``exec`` and ``files`` go
through it, so a command that runs proves the stream answers.

A sandbox process can kill the agent or put its own listener at the agent's path: the
first fails the session with the reason (the host does not reconnect to whatever listens
there next), the second is just another hostile agent, which fails only its own session.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.agent import PROTOCOL
from deskbox_server.api.auth import key_id
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.engines.runc.stream import AGENT_SOCKET, agent_link
from deskbox_server.sessions.desktop import AnyDesktop
from deskbox_server.settings import Settings

from ..api.conftest import KEY_A, Server, running_server
from ..api.served import init_of, reap, remove_sandboxes, serve
from ..api.test_exec import host_runc_execs
from ..images import IMAGE_STATE_DIR
from ..impostors import (
    failed_event,
    hibernate_resume,
    new_session,
    run,
    start_impostor,
    wait_failed,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

PAGE = {"start_url": "data:text/html,<body style='background:%23c00'>agent</body>"}

# Runs in the sandbox (its python3): removes the agent's socket and listens at its path
# instead, answering every connection with bytes that are not HTTP/2.
IMPOSTOR = r"""
import os, socket
path = "/tmp/.X11-unix/deskbox-agent"
os.unlink(path)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(16)
open("/tmp/impostor-ready", "w").close()
while True:
    connection, _ = listener.accept()
    with open("/tmp/impostor-connections", "a") as log:
        log.write("connected\n")
    try:
        connection.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + os.urandom(4096))
    except OSError:
        pass
"""

# Runs in the sandbox: the image's own agent, told to speak protocol 2, at the agent's path.
OTHER_VERSION = r"""
import os, sys, threading, time
sys.path.append("/usr/lib/deskbox-agent")
import deskbox_agent.routes as routes
from deskbox_agent.__main__ import main
routes.PROTOCOL = 2
path = "/tmp/.X11-unix/deskbox-agent"
first = os.stat(path).st_ino
def ready():
    while True:
        try:
            if os.stat(path).st_ino != first:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    time.sleep(0.2)
    open("/tmp/impostor-ready", "w").close()
threading.Thread(target=ready, daemon=True).start()
main(["--listen", "unix:" + path])
"""

# Runs in the sandbox: the pids of the deskbox-agent processes it can see.
FIND_AGENT = r"""
import os
def agents():
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"/deskbox-agent") for a in argv) and b"--listen" in argv:
                yield int(entry)
"""
# It waits a moment first: the agent it kills is the one that answers the exec that
# started it, and a kill before that answer failed the exec call itself.
KILL_AGENT = FIND_AGENT + r"""
import signal, time
time.sleep(0.5)
for pid in agents():
    os.kill(pid, signal.SIGKILL)
"""
DESCRIBE_AGENT = FIND_AGENT + r"""
pid = next(agents())
for line in open(f"/proc/{pid}/status"):
    if line.startswith(("CapEff", "Uid")):
        print(line.strip())
env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
print(*[v.decode() for v in env if v.startswith(b"DISPLAY=")])
print("self uid", os.getuid())
"""


def settings(state_dir: Path) -> Settings:
    return Settings(state_dir=state_dir, api_keys=[KEY_A], image_state_dir=IMAGE_STATE_DIR,
                    reaper_interval_s=0.5, max_sessions=8, max_sessions_per_key=8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(settings(tmp_path_factory.mktemp("agent-stream-state"))) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        http.timeout = httpx.Timeout(120)
        yield http


def new_page_session(client: httpx.Client, **body: Any) -> str:
    return new_session(client, browser=PAGE, **body)


def handle_of(server: Server, session_id: str) -> AnyDesktop:
    found = server.services.manager.handle(key_id(KEY_A), session_id)
    assert isinstance(found.sandbox, RuncSandbox)
    return found


def answers(client: httpx.Client, session_id: str, mark: str) -> None:
    """exec and files of the session work, through its agent, and see its own files."""
    put = client.put(f"/v1/sessions/{session_id}/files", params={"path": "/tmp/mark"},
                     content=mark.encode())
    assert put.status_code == 200, put.text
    assert run(client, session_id, "cat", "/tmp/mark")["stdout"] == mark
    got = client.get(f"/v1/sessions/{session_id}/files", params={"path": "/tmp/mark"})
    assert got.status_code == 200 and got.content == mark.encode()


def check_stream(handle: AnyDesktop) -> None:
    """The host holds a live, handshaken stream to the sandbox's own agent, through its
    link of the agent's socket."""
    agent = handle.agent
    assert agent is not None and agent.failed_reason is None
    assert agent.hello_info.protocol == PROTOCOL
    sandbox = handle.sandbox
    link = agent_link(sandbox)
    assert os.stat(link).st_ino == os.stat(sandbox.socket_dir / AGENT_SOCKET).st_ino
    assert handle.failure() is None


def test_a_fresh_session_answers_through_its_agent(client: httpx.Client, server: Server) -> None:
    sid = new_page_session(client)
    try:
        handle = handle_of(server, sid)
        check_stream(handle)
        answers(client, sid, "fresh")
        assert host_runc_execs(handle.sandbox.container_id) == 0
        # The agent runs in the sandbox as its other processes do: no capability, the same
        # uid, DISPLAY set for its desktop calls.
        status = run(client, sid, "python3", "-c", DESCRIBE_AGENT)["stdout"]
        assert "CapEff:\t0000000000000000" in status, status
        assert f"DISPLAY=:{handle.sandbox.inner_display}" in status, status
        uid = status.split("self uid ")[1].strip()
        assert f"Uid:\t{uid}\t" in status, status
        log = run(client, sid, "cat", "/run/deskbox/session.log")["stdout"]
        assert "started agent" in log, log
    finally:
        client.delete(f"/v1/sessions/{sid}")


def test_hibernate_closes_the_stream_and_resume_connects_a_new_one(
    client: httpx.Client, server: Server
) -> None:
    sid = new_page_session(client)
    try:
        answers(client, sid, "before")
        hibernating = handle_of(server, sid)
        before = hibernating.agent
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200, paused.text
        assert hibernating.agent is None
        assert before is not None and before.failed_reason is not None  # closed by us
        resumed = client.post(f"/v1/sessions/{sid}/resume")
        assert resumed.status_code == 200, resumed.text
        handle = handle_of(server, sid)
        check_stream(handle)
        assert handle.agent is not before
        assert run(client, sid, "cat", "/tmp/mark")["stdout"] == "before"
        answers(client, sid, "after")
    finally:
        client.delete(f"/v1/sessions/{sid}")


def test_each_copy_of_a_fork_has_its_own_stream(client: httpx.Client, server: Server) -> None:
    sid = new_page_session(client)
    copies: list[str] = []
    try:
        answers(client, sid, "source")
        response = client.post(f"/v1/sessions/{sid}/fork", json={"count": 2})
        assert response.status_code == 201, response.text
        copies = [s["id"] for s in response.json()["sessions"]]
        handles = [handle_of(server, s) for s in [sid, *copies]]
        agents = {id(h.agent) for h in handles}
        assert len(agents) == 3
        for handle in handles:
            check_stream(handle)
        for index, session_id in enumerate([sid, *copies]):
            assert run(client, session_id, "cat", "/tmp/mark")["stdout"] == "source"
            answers(client, session_id, f"copy {index}")
        for index, session_id in enumerate([sid, *copies]):  # each wrote only its own
            assert run(client, session_id, "cat", "/tmp/mark")["stdout"] == f"copy {index}"
    finally:
        for session_id in [*copies, sid]:
            client.delete(f"/v1/sessions/{session_id}")


def test_a_session_from_a_snapshot_answers(client: httpx.Client, server: Server) -> None:
    sid = new_page_session(client)
    made: str | None = None
    snap_id: str | None = None
    try:
        answers(client, sid, "snapshotted")
        taken = client.post(f"/v1/sessions/{sid}/snapshots")
        assert taken.status_code == 201, taken.text
        snap_id = taken.json()["id"]
        check_stream(handle_of(server, sid))  # the source reconnected after its dump
        answers(client, sid, "source after")
        made = new_page_session(client, from_snapshot=snap_id)
        check_stream(handle_of(server, made))
        assert run(client, made, "cat", "/tmp/mark")["stdout"] == "snapshotted"
        answers(client, made, "made")
    finally:
        for session_id in (made, sid):
            if session_id is not None:
                client.delete(f"/v1/sessions/{session_id}")
        if snap_id is not None:
            client.delete(f"/v1/snapshots/{snap_id}")


def test_a_killed_agent_fails_only_its_session_with_the_reason(
    client: httpx.Client, server: Server
) -> None:
    """Decided: the agent is part of the desktop like its X server. Its init starts it
    again, but the host does not reconnect to whatever listens at its path next: the
    session fails, and says why."""
    neighbour = new_page_session(client)
    victim = new_page_session(client)
    try:
        started = run(client, victim, "python3", "-c", KILL_AGENT, background=True)
        assert started["pid"], started
        body = wait_failed(client, victim)
        assert "agent" in body["failure"]["reason"], body
        event = failed_event(client, victim)
        assert "agent" in (event.get("reason") or ""), event
        answers(client, neighbour, "still here")
    finally:
        client.delete(f"/v1/sessions/{victim}")
        client.delete(f"/v1/sessions/{neighbour}")


@pytest.mark.parametrize(("impostor", "wanted"), [
    (IMPOSTOR, ("not HTTP/2",)),
    (OTHER_VERSION, ("the agent speaks protocol 2", f"this server speaks protocol {PROTOCOL}")),
], ids=["garbage", "other-version"])
def test_an_impostor_agent_fails_only_its_own_session(
    client: httpx.Client, server: Server, impostor: str, wanted: tuple[str, ...]
) -> None:
    """A process of the sandbox binds its own listener at the agent's path. The host's
    stream goes on to the real agent (it connected through its own link); after a restore
    the host takes the path's socket, which is the impostor's: garbage instead of HTTP/2,
    or an agent of another protocol version. That session fails with the reason, in the
    API and in its events; the server and a neighbour go on."""
    neighbour = new_page_session(client)
    victim = new_page_session(client)
    try:
        start_impostor(client, victim, impostor)
        # Swapping the path does nothing to the host's stream, which still reaches the agent.
        answers(client, victim, "swapped")
        agent = handle_of(server, victim).agent
        assert agent is not None and agent.failed_reason is None

        resumed = hibernate_resume(client, victim)
        assert resumed.status_code == 502, resumed.text
        assert resumed.json()["error"]["type"] == "session_failed"
        body = wait_failed(client, victim)
        reason = body["failure"]["reason"]
        assert "agent" in reason and all(part in reason for part in wanted), reason
        event = failed_event(client, victim)
        assert event.get("reason") == reason, event
        answers(client, neighbour, "neighbour")
        assert client.get("/healthz").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{victim}")
        client.delete(f"/v1/sessions/{neighbour}")


def test_a_restarted_server_reconnects_to_the_agents_it_adopts(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    log = tmp_path / "server.log"
    inits: list[int] = []
    try:
        with serve(state_dir, log) as (first, http):
            http.timeout = httpx.Timeout(120)
            sid = new_page_session(http)
            answers(http, sid, "first server")
            inits.append(init_of(sid))
            first.send_signal(signal.SIGKILL)
            first.wait()
        with serve(state_dir, log) as (second, http):
            http.timeout = httpx.Timeout(120)
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "running"
            assert run(http, sid, "cat", "/tmp/mark")["stdout"] == "first server"
            answers(http, sid, "second server")
            assert http.delete(f"/v1/sessions/{sid}").status_code == 204
            second.terminate()
            second.wait(timeout=60)
        reap(inits)
    finally:
        remove_sandboxes(state_dir, inits)
