"""The docker engine on rootless Podman, with the server itself running as that ordinary
user, no root anywhere in the session's path (issue 17 "Rootless").

This host has cgroup v1, where a rootless Podman has no cgroup to put a container in: the
engine says so in ``/healthz``, drops the capabilities that need one (freeze, resources:
a pause or limits are a 422 naming the engine) and still confines each container as far as
an ordinary user can (no capabilities, no-new-privileges, seccomp, read-only root, no
network). Nothing caps one session's processes there: the daemon's own process limit caps
all its containers' together.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.docker.spec import ContainerLimits, container_body

from ..api.containers import create_running
from ..api.helpers import assert_error, decode
from ..api.served import serve
from ..scratch import scratch_dir
from .podman import Podman, podman_service, rootless_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    return rootless_user()


@pytest.fixture(scope="module")
def rootless_podman(user: pwd.struct_passwd) -> Iterator[Podman]:
    try:
        with podman_service(user) as service:
            yield service
    finally:
        # Rootless Podman keeps a process holding its user namespace (the "pause process");
        # nothing of that user may outlive the tests.
        subprocess.run(["pkill", "-KILL", "-u", user.pw_name], check=False)


@pytest.fixture(scope="module")
def client(
    request: pytest.FixtureRequest, rootless_podman: Podman, user: pwd.struct_passwd
) -> Iterator[httpx.Client]:
    base = scratch_dir(request, "deskbox-rootless-tests-")
    os.chown(base, user.pw_uid, user.pw_gid)
    env = {"DESKBOX_BACKENDS": "docker", "DESKBOX_DEFAULT_BACKEND": "docker",
           "DESKBOX_DOCKER_HOST": rootless_podman.url, "DESKBOX_START_TIMEOUT_S": "120"}
    # The first start loads the OCI image into the user's new storage.
    with serve(base / "state", base / "server.log", env, timeout_s=180.0,
               ready_timeout_s=600.0, user=user) as (process, http):
        assert _owner(process.pid, user) == user.pw_uid
        yield http


def _owner(wrapper_pid: int, user: pwd.struct_passwd) -> int:
    """The uid of the server under runuser (its child)."""
    children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    (server,) = children
    return Path(f"/proc/{server}").stat().st_uid


def test_healthz_says_what_a_rootless_engine_lacks(client: httpx.Client) -> None:
    engine = client.get("/healthz").json()["engines"]["docker"]
    assert engine["capabilities"] == ["adopt", "exec"]
    assert engine["details"]["rootless"] == "yes, on cgroup v1: no limits and no pause"
    assert engine["details"]["limits"] == (
        "none (no cpu, memory, pids limits, no pause: rootless on cgroup v1, no cgroup to put "
        "a container in)")


def test_a_session_runs_with_no_root_in_its_path(
    client: httpx.Client, rootless_podman: Podman, user: pwd.struct_passwd
) -> None:
    session = create_running(client)
    try:
        shot = client.get(f"/v1/sessions/{session['id']}/screenshot")
        assert shot.status_code == 200, shot.text
        assert decode(shot.content).size == (1280, 800)
        ran = client.post(f"/v1/sessions/{session['id']}/exec", json={"cmd": [
            "sh", "-c", "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
            "cat /proc/self/uid_map; ls /sys/class/net"]})
        assert ran.status_code == 200, ran.text
        out: dict[str, Any] = ran.json()
        lines = out["stdout"].split("\n")
        assert "CapEff:\t0000000000000000" in lines and "NoNewPrivs:\t1" in lines
        assert "Seccomp:\t2" in lines
        # uid 0 inside is the ordinary user outside.
        assert f"0 {user.pw_uid} 1" in " ".join(out["stdout"].split())
        assert out["stdout"].split()[-1] == "lo"
        (name,) = [n for n in rootless_podman.cli("ps", "--format", "{{.Names}}").stdout.split()
                   if n.endswith(session["id"])]
        paused = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": "freeze"})
        assert "docker engine" in assert_error(paused, 422, "invalid_request")["message"]
        limited = client.post("/v1/sessions", json={"resources": {"memory_mb": 1024}})
        assert "resources" in assert_error(limited, 422, "invalid_request")["message"]
    finally:
        assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert name not in rootless_podman.cli("ps", "--all", "--format", "{{.Names}}").stdout


def test_a_rootless_container_asks_for_no_nproc_ulimit() -> None:
    """What the engine asks a daemon for (uid 0 of every rootless container is the daemon's
    user in one user namespace, where the kernel counts RLIMIT_NPROC: a session's pids as
    each container's nproc would be one budget for all the sessions and the daemon; with
    the podman CLI, which applies it, a second container with nproc 300 could not fork
    once the first ran 200 processes. Podman 4.3's compatible API drops a rootless
    container's Ulimits, so no session here can show it): a rootful container gets nproc
    (Podman 4.3's default is above what its runtime may set; the host's root is not counted
    anyway), a rootless one only nofile, and keeps its daemon's own process limit."""
    limits = ContainerLimits(pids=128, nofile=4096)

    def ulimits(rootless: bool) -> dict[str, tuple[int, int]]:
        body = container_body("deskbox-session:test", DesktopSpec(), Path("/run/x"), limits,
                              "/seccomp.json", {}, bind_flags=True, held=frozenset(),
                              rootless=rootless)
        return {u["Name"]: (u["Soft"], u["Hard"]) for u in body["HostConfig"]["Ulimits"]}

    assert ulimits(rootless=False) == {"nofile": (4096, 4096), "nproc": (128, 128)}
    assert ulimits(rootless=True) == {"nofile": (4096, 4096)}
