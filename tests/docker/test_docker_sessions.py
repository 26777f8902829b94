"""The docker engine end to end, through a ``deskbox serve`` whose only backend is docker,
against the package's Podman service (conftest.py): a session is a container of the OCI
image; its agent answers screenshots, clicks, typing, exec and DevTools as on runc; the
container is confined as a runc sandbox is; pause is the engine's pause; what the Engine
API cannot do is refused with 422 before anything starts; a killed server's container is
adopted by the next; a container stopped behind the server's back fails its session, one
paused behind its back is refused (409) until unpaused; and nothing is left behind.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..api.containers import act, page_origin
from ..api.containers import create_running as create
from ..api.helpers import assert_error, decode, events_until
from ..api.sandbox_page import SandboxPage, events_data_url
from ..api.served import serve, serve_refused
from ..scratch import scratch_dir
from .podman import Podman

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TEXT = "docker ✓ wörld"


@dataclass
class Server:
    process: Any
    client: httpx.Client
    state_dir: Path
    log: Path


@contextlib.contextmanager
def docker_server(
    podman: Podman, state_dir: Path, log: Path, extra_env: dict[str, str] | None = None,
) -> Iterator[Server]:
    env = {"DESKBOX_BACKENDS": "docker", "DESKBOX_DEFAULT_BACKEND": "docker",
           "DESKBOX_DOCKER_HOST": podman.url, "DESKBOX_START_TIMEOUT_S": "60",
           **(extra_env or {})}
    # The first server loads the OCI image into the new storage before it answers.
    with serve(state_dir, log, env, timeout_s=120.0, ready_timeout_s=300.0) as (
            process, client):
        yield Server(process, client, state_dir, log)


@pytest.fixture(scope="module")
def base(request: pytest.FixtureRequest) -> Path:
    return scratch_dir(request, "deskbox-docker-tests-")


@pytest.fixture(scope="module")
def server(podman: Podman, base: Path) -> Iterator[Server]:
    with docker_server(podman, base / "state", base / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> httpx.Client:
    return server.client


def containers(podman: Podman) -> list[str]:
    listed = podman.cli("ps", "--all", "--format", "{{.Names}}")
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def inspect(podman: Podman, name: str, template: str) -> str:
    shown = podman.cli("inspect", "--format", template, name)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip()


def container_name(server: Server, session: dict[str, Any], podman: Podman) -> str:
    (name,) = [name for name in containers(podman) if name.endswith(session["id"])]
    return name


def run(client: httpx.Client, session: dict[str, Any], script: str) -> str:
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["sh", "-c", script]})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    made = create(client, browser={"start_url": events_data_url()})
    yield made
    client.delete(f"/v1/sessions/{made['id']}")


def test_healthz_describes_the_engine(client: httpx.Client, podman: Podman) -> None:
    engine = client.get("/healthz").json()["engines"]["docker"]
    assert engine["capabilities"] == ["adopt", "exec", "freeze", "resources"]
    assert engine["egress"] == ["none"]
    assert engine["details"]["engine_api"] == podman.url
    assert engine["details"]["daemon"].startswith("Podman Engine 4.")
    assert engine["details"]["image"].startswith("localhost/deskbox-session:")
    # Read from Podman's own info (its cgroup controllers; cgroup v1 on this host).
    assert engine["details"]["limits"] == "cpu, memory, pids"


def test_the_desktop_answers_as_on_runc(
    client: httpx.Client, session: dict[str, Any], podman: Podman, server: Server
) -> None:
    assert session["backend"] == "docker"
    shot = client.get(f"/v1/sessions/{session['id']}/screenshot")
    assert shot.status_code == 200, shot.text
    assert decode(shot.content).size == (1280, 800)
    with SandboxPage(client, session["id"]) as page:
        page.wait(lambda state: state["clicks"] == 0, timeout_s=30)
        x, y = page_origin(client, session, page)
        act(client, session, {"actions": [{"type": "click", "x": x + 900, "y": y + 175},
                                          {"type": "type", "text": TEXT}]})
        state = page.wait(lambda state: state["value"] == TEXT, timeout_s=30)
    assert state["clicks"] == 2 and state["value"] == TEXT
    version = client.get(f"/v1/sessions/{session['id']}/cdp/json/version")
    assert version.status_code == 200 and "Chrome/" in version.json()["Browser"]


def test_the_container_is_confined(
    client: httpx.Client, session: dict[str, Any], podman: Podman, server: Server
) -> None:
    status = run(client, session, "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' "
                 "/proc/self/status; ls /sys/class/net; touch /usr/x 2>&1 || true")
    fields = dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"] == "0" * 16 and fields["CapBnd"] == "0" * 16
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert "lo" in status.split() and "eth0" not in status  # egress none: loopback only
    assert "Read-only file system" in status
    # Our own seccomp rules, beyond Podman's: no user namespace, no vsock.
    denied = run(client, session, "unshare -U true 2>&1; python3 -c "
                 "'import socket; socket.socket(40, 1)' 2>&1 | tail -1; true")
    assert "Operation not permitted" in denied and "Address family not supported" in denied
    name = container_name(server, session, podman)
    assert inspect(podman, name, "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} "
                   "{{.HostConfig.ReadonlyRootfs}}") == f"{2048 * 1024 * 1024} 1024 true"
    assert cpu_quota(podman, name) == (100_000, 100_000)
    # Its one host path, the socket directory, is a small tmpfs: it filled the state
    # dir's disk for every session of the host.
    filled = run(client, session, "head -c 10M /dev/zero 2>&1 >/tmp/.X11-unix/fill; "
                 "rm -f /tmp/.X11-unix/fill; true")
    assert "No space left on device" in filled, filled


def cpu_quota(podman: Podman, name: str) -> tuple[int, int]:
    """The container's CFS quota and period (µs), read from its cgroup: Podman's inspect
    shows the quota it was created with, not one changed since."""
    pid = inspect(podman, name, "{{.State.Pid}}")
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            group = Path("/sys/fs/cgroup", controllers, path.lstrip("/"))
            return (int((group / "cpu.cfs_quota_us").read_text()),
                    int((group / "cpu.cfs_period_us").read_text()))
    quota, period = (Path("/sys/fs/cgroup") / path.lstrip("/") / "cpu.max").read_text().split()
    return int(quota), int(period)  # cgroup v2: one hierarchy ("0::/path")


def test_resources_become_the_containers_limits(
    client: httpx.Client, podman: Podman, server: Server
) -> None:
    """At the floors too: the container starts at the host's full CPU, as a runc sandbox
    does, and gets its quota once the desktop is ready. Made with its quota, a session at
    cpus 0.01 did not start in time (and below 0.01 Docker refused the create: a 502)."""
    refused = client.post("/v1/sessions", json={"resources": {"cpus": 0.005}})
    assert "resources.cpus" in assert_error(refused, 422, "invalid_request")["message"]
    made = create(client, resources={"cpus": 0.01, "memory_mb": 256, "pids": 128})
    try:
        name = container_name(server, made, podman)
        assert inspect(podman, name, "{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}") == (
            f"{256 * 1024 * 1024} 128")
        assert cpu_quota(podman, name) == (1000, 100_000)
        assert client.get(f"/v1/sessions/{made['id']}/screenshot").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{made['id']}")


def test_what_the_engine_lacks_is_refused_before_anything_starts(
    client: httpx.Client, session: dict[str, Any], podman: Podman
) -> None:
    before = containers(podman)
    refused = client.post("/v1/sessions", json={
        "network": {"egress": "allowlist", "allow": ["127.0.0.1"]}})
    assert "docker engine" in assert_error(refused, 422, "invalid_request")["message"]
    hibernate = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": "hibernate"})
    assert "docker engine" in assert_error(hibernate, 422, "invalid_request")["message"]
    snapshot = client.post(f"/v1/sessions/{session['id']}/snapshots")
    assert snapshot.status_code == 422, snapshot.text
    assert containers(podman) == before


def test_pause_is_the_engines_pause(
    client: httpx.Client, session: dict[str, Any], podman: Podman, server: Server
) -> None:
    name = container_name(server, session, podman)
    paused = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": "freeze"})
    assert paused.status_code == 200, paused.text
    assert inspect(podman, name, "{{.State.Status}}") == "paused"
    refused = client.post(f"/v1/sessions/{session['id']}/actions",
                          json={"type": "key", "keys": "a"})
    assert_error(refused, 409, "conflict")
    resumed = client.post(f"/v1/sessions/{session['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    assert inspect(podman, name, "{{.State.Status}}") == "running"
    assert client.get(f"/v1/sessions/{session['id']}/screenshot").status_code == 200


def test_a_paused_session_whose_container_was_unpaused_outside_resumes(
    client: httpx.Client, podman: Podman, server: Server
) -> None:
    """The resume's unpause is refused by the daemon (the container runs already): the
    session resumed all the same (it stayed paused, the resume a 500)."""
    made = create(client)
    name = container_name(server, made, podman)
    paused = client.post(f"/v1/sessions/{made['id']}/pause", json={"mode": "freeze"})
    assert paused.status_code == 200, paused.text
    assert podman.cli("unpause", name).returncode == 0
    resumed = client.post(f"/v1/sessions/{made['id']}/resume")
    assert resumed.status_code == 200, resumed.text
    assert client.get(f"/v1/sessions/{made['id']}").json()["state"] == "running"
    assert run(client, made, "echo on") == "on\n"
    assert client.delete(f"/v1/sessions/{made['id']}").status_code == 204


def test_a_container_stopped_behind_the_servers_back_fails_its_session(
    client: httpx.Client, podman: Podman, server: Server
) -> None:
    doomed = create(client)
    name = container_name(server, doomed, podman)
    assert podman.cli("kill", name).returncode == 0
    deadline = time.monotonic() + 30
    while (state := client.get(f"/v1/sessions/{doomed['id']}").json())["state"] != "failed":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert state["failure"]["reason"], state
    assert client.delete(f"/v1/sessions/{doomed['id']}").status_code == 204
    assert name not in containers(podman)


def test_a_session_whose_init_ends_says_why(client: httpx.Client) -> None:
    doomed = create(client)
    run(client, doomed, "kill -9 $(pidof Xvfb)")
    deadline = time.monotonic() + 30
    while (state := client.get(f"/v1/sessions/{doomed['id']}").json())["state"] != "failed":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert "(its init: xserver exited with -9)" in state["failure"]["reason"], state
    assert client.delete(f"/v1/sessions/{doomed['id']}").status_code == 204


def test_a_container_paused_behind_the_servers_back_is_refused_until_unpaused(
    podman: Podman, base: Path,
) -> None:
    """`podman pause` of a session's container, not through the API. An action then in
    flight is answered 409 once the engine's watcher and the reaper saw the pause, not at
    its 30 s deadline (where it had failed the session); then calls are answered 409 at
    once with the reason; unpaused, the session goes on; paused again and deleted, it is
    gone."""
    state_dir, log = base / "held-state", base / "held.log"
    with docker_server(podman, state_dir, log, {"DESKBOX_REAPER_INTERVAL_S": "1"}) as running:
        client = running.client
        made = create(client)
        session_id = made["id"]
        name = container_name(running, made, podman)
        assert podman.cli("pause", name).returncode == 0
        sent = time.monotonic()
        in_flight = client.post(f"/v1/sessions/{session_id}/actions",
                                json={"type": "cursor_position"})
        # The watcher looks every 2 s, the reaper here every 1 s.
        assert time.monotonic() - sent < 10
        assert_error(in_flight, 409, "conflict")
        assert "paused outside Deskbox" in in_flight.json()["error"]["message"]
        started = time.monotonic()
        for refused in (
            client.get(f"/v1/sessions/{session_id}/screenshot"),
            client.post(f"/v1/sessions/{session_id}/exec", json={"cmd": ["true"]}),
            client.post(f"/v1/sessions/{session_id}/pause", json={"mode": "freeze"}),
        ):
            assert_error(refused, 409, "conflict")
            assert f"{name} was paused outside Deskbox" in refused.json()["error"]["message"]
        assert time.monotonic() - started < 3  # at once, not at a call's deadline
        assert client.get(f"/v1/sessions/{session_id}").json()["state"] == "running"
        assert podman.cli("unpause", name).returncode == 0
        deadline = time.monotonic() + 10
        while (shot := client.get(f"/v1/sessions/{session_id}/screenshot")).status_code == 409:
            assert time.monotonic() < deadline, shot.text
            time.sleep(0.2)
        assert shot.status_code == 200, shot.text
        echoed = client.post(f"/v1/sessions/{session_id}/exec", json={"cmd": ["echo", "on"]})
        assert echoed.status_code == 200 and echoed.json()["stdout"] == "on\n", echoed.text
        assert client.get(f"/v1/sessions/{session_id}").json()["state"] == "running"
        held, released = events_until(client, session_id, "sandbox_released")[-2:]
        assert held["type"] == "sandbox_held", held
        assert f"{name} was paused outside Deskbox" in held["reason"]
        assert released["type"] == "sandbox_released", released
        # Paused outside again, then deleted: nothing of it is left.
        assert podman.cli("pause", name).returncode == 0
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
        assert client.get(f"/v1/sessions/{session_id}").json()["state"] == "stopped"
        assert name not in containers(podman)


def test_delete_leaves_nothing(client: httpx.Client, podman: Podman, server: Server) -> None:
    made = create(client)
    name = container_name(server, made, podman)
    socket_dir = server.state_dir / "docker" / made["id"]
    assert socket_dir.is_dir()
    assert client.delete(f"/v1/sessions/{made['id']}").status_code == 204
    assert name not in containers(podman)
    assert not socket_dir.exists()


def left_by_a_killed_server(podman: Podman, state_dir: Path, log: Path
                            ) -> tuple[dict[str, Any], str]:
    """A session, and its container's name, whose server was killed (SIGKILL)."""
    with docker_server(podman, state_dir, log) as first:
        made = create(first.client)
        name = container_name(first, made, podman)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    return made, name


def test_a_killed_servers_container_is_adopted_by_the_next(podman: Podman, base: Path) -> None:
    state_dir, log = base / "restart-state", base / "restart.log"
    made, name = left_by_a_killed_server(podman, state_dir, log)
    assert name in containers(podman)  # the container outlives its server
    # Paused meanwhile (or by a pause the killed server had not recorded): the record says
    # running, so the next server unpauses it; its agent answered no handshake before.
    assert podman.cli("pause", name).returncode == 0
    with docker_server(podman, state_dir, log) as second:
        again = second.client.get(f"/v1/sessions/{made['id']}").json()
        assert again["state"] == "running", again
        shot = second.client.get(f"/v1/sessions/{made['id']}/screenshot")
        assert shot.status_code == 200, shot.text
        assert inspect(podman, name, "{{.State.Status}}") == "running"
    # A server's shutdown ends its sessions, and their containers.
    assert name not in containers(podman)


# The init's status names its children's pids.
STOP_THE_AGENT = ("import json, os, signal\n"
                  "status = json.load(open('/run/deskbox/status.json'))\n"
                  "os.kill(status['pids']['agent'], signal.SIGSTOP)\n")


def test_a_container_the_next_server_cannot_reach_is_removed(
    podman: Podman, base: Path,
) -> None:
    """Its agent does not answer the next server's handshake (stopped here; an agent of
    another protocol version after an upgrade is refused the same way): the session
    fails, and its container goes with the orphans. It ran on, kept as one of the
    server's own sandboxes."""
    state_dir, log = base / "unreachable-state", base / "unreachable.log"
    made, name = left_by_a_killed_server(podman, state_dir, log)
    stopped = podman.cli("exec", name, "python3", "-c", STOP_THE_AGENT)
    assert stopped.returncode == 0, stopped.stderr
    with docker_server(podman, state_dir, log) as second:
        again = second.client.get(f"/v1/sessions/{made['id']}").json()
        assert again["state"] == "failed", again
        assert name not in containers(podman)


def test_a_delete_while_the_daemon_is_down_says_so_and_the_next_start_removes_it(
    podman: Podman, base: Path,
) -> None:
    """The Engine API gone when a session is deleted: the delete answers, the session says
    its container could not be removed (it was reported `stopped` while the container ran
    on), and the next server start removes the container."""
    own = base / "second-service"
    own.mkdir()
    second = Podman(f"unix://{own}/podman.sock", podman.storage, own / "service.log")

    def service() -> subprocess.Popen[bytes]:
        started = subprocess.Popen(
            ["podman", *podman.storage, "system", "service", "--time", "0", second.url],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (own / "podman.sock").exists():
            assert started.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        return started

    daemon = service()
    state_dir, log = base / "outage-state", base / "outage.log"
    try:
        with docker_server(second, state_dir, log) as running:
            made = create(running.client)
            name = container_name(running, made, podman)
            assert running.client.get("/healthz").json()["status"] == "ok"
            daemon.kill()
            daemon.wait()
            (own / "podman.sock").unlink(missing_ok=True)
            health = running.client.get("/healthz").json()  # it said ok with no daemon
            assert health["status"] == "degraded", health
            assert any(problem.startswith("engine docker: the container engine at")
                       and "does not answer" in problem for problem in health["problems"])
            assert running.client.delete(f"/v1/sessions/{made['id']}").status_code == 204
            ended = running.client.get(f"/v1/sessions/{made['id']}").json()
            assert ended["state"] == "failed", ended
            assert "could not be removed" in ended["failure"]["reason"] or \
                "not removed within" in ended["failure"]["reason"], ended
            daemon = service()
        assert name in containers(podman)  # the daemon never heard of the delete
        with docker_server(second, state_dir, log):
            assert name not in containers(podman)  # an orphan of the server: removed at start
    finally:
        daemon.kill()
        daemon.wait()


def test_a_server_whose_engine_api_does_not_answer_says_so(tmp_path: Path) -> None:
    """No daemon at DESKBOX_DOCKER_HOST: the server does not start, and its log says where
    it looked and what to start."""
    output = serve_refused(tmp_path / "state", {
        "DESKBOX_BACKENDS": "docker", "DESKBOX_DEFAULT_BACKEND": "docker",
        "DESKBOX_DOCKER_HOST": f"unix://{tmp_path}/nothing.sock"})
    assert f"the container engine at unix://{tmp_path}/nothing.sock does not answer" in output
    assert "podman system service" in output

