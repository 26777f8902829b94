"""Issue 13, part 2, now that the host speaks no X11 (issue 14): a process of the sandbox
that puts its own socket at the X server's path gets nothing from it.

The host never connects to a sandbox's X socket; the agent inside drives the X server
(AgentDesktop). After a restore the host still links the X socket (displays.py) and checks
that it leads to the session's own X server (``check_xserver_socket``) while the restored
tasks are stopped: only so that the sandbox's own agent meets its real X server.

The attack, run inside a session through ``exec``: a program waits for the restore (the X
socket's inode changes when CRIU re-creates it), then at once renames the real socket and
binds its own in its place, ready to send a 300 MiB X event to whoever connects (the
host's X parser was its target in issue 13). The session goes on: its agent's connection
to the real X server was restored with it, and nothing connects to the impostor.

A variant swaps the socket before the checkpoint is taken: a copy then restores with the
impostor's socket at the X server's path, and the restore must refuse it.
"""

from __future__ import annotations

import resource
import statistics
import time
from typing import Any

import httpx
import pytest

from deskbox_server.engines.runc.criu import Criu

from ..api.helpers import decode

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

PAGE = {"start_url": "data:text/html,<body style='background:%2300c'>real</body>"}
BLUE = (0, 0, 204)

# Runs in the sandbox (its python3). argv: "now" to swap at once, or "restore" to wait for
# the X socket to be re-created first. Every connection it accepts is recorded, and
# answered with the header of a 300 MiB GenericEvent.
IMPOSTOR = r"""
import os, socket, struct, sys, time
directory = "/tmp/.X11-unix"
name = [entry for entry in os.listdir(directory) if entry.startswith("X")][0]
path = os.path.join(directory, name)
if sys.argv[1] == "restore":
    first = os.stat(path).st_ino
    while True:
        try:
            if os.stat(path).st_ino != first:
                break
        except FileNotFoundError:
            pass
        time.sleep(0.0002)
os.rename(path, path + "-real")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(16)
open("/tmp/impostor-ready", "w").close()
while True:
    connection, _ = listener.accept()
    with open("/tmp/impostor-connections", "a") as log:
        log.write("connected\n")
    words = (300 << 20) // 4
    try:
        connection.sendall(bytes([35, 0]) + b"\0\0" + struct.pack("=L", words) + b"\0" * 24)
    except OSError:
        pass
"""


def create(client: httpx.Client) -> str:
    response = client.post("/v1/sessions", json={"browser": PAGE})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def run(client: httpx.Client, session_id: str, cmd: list[str], **extra: Any) -> Any:
    response = client.post(f"/v1/sessions/{session_id}/exec",
                           json={"cmd": cmd, "timeout_s": 30, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def exists(client: httpx.Client, session_id: str, path: str) -> bool:
    return bool(run(client, session_id, ["test", "-e", path])["exit_code"] == 0)


def screenshot_ms(client: httpx.Client, session_id: str, count: int = 15) -> float:
    timings = []
    for _ in range(count):
        started = time.perf_counter()
        response = client.get(f"/v1/sessions/{session_id}/screenshot")
        assert response.status_code == 200, response.text
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def rss_mib() -> float:
    """This process's resident memory now (the server runs in it, on a thread)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_an_impostor_waiting_for_the_restore_never_gets_the_host(
    client: httpx.Client,
) -> None:
    neighbour = create(client)
    target = create(client)
    try:
        before_ms = screenshot_ms(client, neighbour)
        started = run(client, target, ["python3", "-c", IMPOSTOR, "restore"], background=True)
        assert started["pid"], started
        rss_before = rss_mib()

        paused = client.post(f"/v1/sessions/{target}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200, paused.text
        resumed = client.post(f"/v1/sessions/{target}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["state"] == "running"

        # The impostor ran after the restore and took the socket's path ...
        deadline = time.monotonic() + 20
        while not exists(client, target, "/tmp/impostor-ready"):
            assert time.monotonic() < deadline, "the impostor never swapped the socket"
            time.sleep(0.2)
        # ... but the agent drives the real X server: actions and the screen work, and the
        # impostor never had a connection (the host makes none to an X socket).
        click = client.post(f"/v1/sessions/{target}/actions",
                            json={"type": "click", "x": 600, "y": 500})
        assert click.status_code == 200, click.text
        shot = client.get(f"/v1/sessions/{target}/screenshot", params={"format": "png"})
        assert shot.status_code == 200, shot.text
        assert decode(shot.content).getpixel((640, 500))[:3] == BLUE
        assert not exists(client, target, "/tmp/impostor-connections")
        assert client.get(f"/v1/sessions/{target}").json()["state"] == "running"

        # The server and the neighbour did not notice.
        assert rss_mib() - rss_before < 100
        assert screenshot_ms(client, neighbour) < before_ms * 5 + 50
        assert client.get("/healthz").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{target}")
        client.delete(f"/v1/sessions/{neighbour}")


def test_a_copy_restored_with_an_impostor_at_the_x_path_is_refused(
    client: httpx.Client,
) -> None:
    source = create(client)
    try:
        run(client, source, ["python3", "-c", IMPOSTOR, "now"], background=True)
        deadline = time.monotonic() + 20
        while not exists(client, source, "/tmp/impostor-ready"):
            assert time.monotonic() < deadline, "the impostor never swapped the socket"
            time.sleep(0.2)
        rss_before = rss_mib()
        # (The source's own agent may meet the impostor now: a sandbox may break its own
        # desktop. The host never connects to a sandbox's X socket.)

        forked = client.post(f"/v1/sessions/{source}/fork", json={"count": 1})
        if forked.status_code == 201:  # CRIU took it: the copy must not be handed out
            copy = forked.json()["sessions"][0]["id"]
            client.delete(f"/v1/sessions/{copy}")
            pytest.fail(f"a copy with an impostor X socket was handed out: {forked.text}")
        body = forked.json()["error"]
        assert forked.status_code in (422, 502), forked.text
        assert body["message"], forked.text
        assert rss_mib() - rss_before < 100
        assert client.get(f"/v1/sessions/{source}").json()["state"] == "running"
        assert not exists(client, source, "/tmp/impostor-connections")
    finally:
        client.delete(f"/v1/sessions/{source}")
