"""``exec`` and ``files`` end to end: a real server, real runc sandboxes, real HTTP.

Commands and file I/O run inside the session's sandbox only; what the sandbox sends back
is capped. The isolation checks that need a command (the server's state dir and API key,
the control plane's port, the read-only root) run through the API, as an agent would.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import ValidationError

from deskbox_agent.limits import Limits
from deskbox_server.api.auth import key_id
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.settings import (
    AGENT_MAX_EXEC_OUTPUT,
    AGENT_MAX_EXEC_TIMEOUT_S,
    AGENT_MAX_FILE_BYTES,
    Settings,
)

from ..images import IMAGE_STATE_DIR, session_image
from ..rfb_client import RfbViewer
from .conftest import KEY_A, Server, running_server
from .containers import container_server
from .helpers import access_statuses, assert_error, server_log

pytestmark = pytest.mark.slow

OUTPUT_CAP = 64 * 1024
FILE_CAP = 6 * 1024 * 1024  # above max_request_bytes (4 MiB): uploads have their own cap


@pytest.fixture(scope="module")
def box_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A container-backend server whose API key is generated into its state dir."""
    session_image()
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("exec-state"),
        api_keys=[],
        backends=["container"],
        default_backend="container",
        image_state_dir=IMAGE_STATE_DIR,
        exec_output_max_bytes=OUTPUT_CAP,
        exec_max_timeout_s=120,
        file_max_bytes=FILE_CAP,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="module")
def api_key(box_server: Server) -> str:
    return box_server.settings.api_key_path.read_text().strip()


@pytest.fixture(scope="module")
def box_client(box_server: Server, api_key: str) -> Iterator[httpx.Client]:
    with box_server.client(api_key) as http:
        yield http


def new_session(client: httpx.Client) -> str:
    response = client.post(
        "/v1/sessions", json={"display": {"width": 800, "height": 600}, "timeout_s": 600}
    )
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


@pytest.fixture(scope="module")
def box(box_client: httpx.Client) -> Iterator[str]:
    session_id = new_session(box_client)
    try:
        yield session_id
    finally:
        box_client.delete(f"/v1/sessions/{session_id}")


def run(client: httpx.Client, session_id: str, *cmd: str, **fields: Any) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{session_id}/exec", json={"cmd": list(cmd), **fields})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def sandbox_process_names(client: httpx.Client, session_id: str) -> list[str]:
    script = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done"
    return str(run(client, session_id, "sh", "-c", script)["stdout"]).split()


# -- exec -----------------------------------------------------------------------------------


def test_exec_output_and_exit_codes(box_client: httpx.Client, box: str) -> None:
    body = run(box_client, box, "sh", "-c", "echo out; echo err >&2; exit 3")
    assert body["exit_code"] == 3
    assert body["stdout"] == "out\n" and body["stderr"] == "err\n"
    assert body["stdout_truncated"] is False and body["stderr_truncated"] is False
    assert body["timed_out"] is False and body["pid"] is None
    assert run(box_client, box, "true")["exit_code"] == 0
    killed = run(box_client, box, "sh", "-c", "kill -9 $$")
    assert killed["exit_code"] == 128 + 9
    missing = run(box_client, box, "no-such-program")
    assert missing["exit_code"] == 127 and "no-such-program" in missing["stderr"]


def test_exec_is_argv_only(box_client: httpx.Client, box: str) -> None:
    body = run(box_client, box, "echo", "$HOME; touch /tmp/pwned", "`id`")
    assert body["stdout"] == "$HOME; touch /tmp/pwned `id`\n"
    assert run(box_client, box, "test", "-e", "/tmp/pwned")["exit_code"] == 1


def test_exec_environment(box_client: httpx.Client, box: str, box_server: Server,
                          api_key: str) -> None:
    handle = box_server.services.manager.handle(key_id(api_key), box)
    assert isinstance(handle.sandbox, RuncSandbox)
    code = "import os; print(os.environ['DISPLAY'], os.environ['GREETING'], os.getuid())"
    body = run(box_client, box, "python3", "-c", code, env={"GREETING": "hello world"})
    assert body["stdout"].split() == [handle.sandbox.display_name, "hello", "world", "0"]
    # The launcher's own variables are not passed on.
    assert "DESKBOX_" not in run(box_client, box, "env")["stdout"]
    # It reaches the session's X server through DISPLAY.
    xcheck = (
        "import socket, os; s = socket.socket(socket.AF_UNIX);"
        "s.connect('/tmp/.X11-unix/X' + os.environ['DISPLAY'][1:]); print('ok')"
    )
    assert run(box_client, box, "python3", "-c", xcheck)["stdout"] == "ok\n"


def test_exec_runs_confined(box_client: httpx.Client, box: str) -> None:
    status = run(box_client, box, "cat", "/proc/self/status")["stdout"]
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields[cap])
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"
    names = sandbox_process_names(box_client, box)
    assert "deskbox-session" in names and "Xvfb" in names
    assert "pytest" not in names and "runc" not in names


def test_exec_output_is_capped_and_flagged(box_client: httpx.Client, box: str) -> None:
    body = run(box_client, box, "sh", "-c",
               f"head -c {OUTPUT_CAP * 4} /dev/zero | tr '\\0' x; echo small >&2")
    assert body["exit_code"] == 0
    assert body["stdout"] == "x" * OUTPUT_CAP and body["stdout_truncated"] is True
    assert body["stderr"] == "small\n" and body["stderr_truncated"] is False


def test_exec_timeout_kills_the_process_tree(box_client: httpx.Client, box: str) -> None:
    started = time.monotonic()
    body = run(box_client, box, "sh", "-c",
               "sleep 300 & sh -c 'sleep 301' & echo started; sleep 302", timeout_s=1)
    assert time.monotonic() - started < 10
    assert body["timed_out"] is True and body["exit_code"] is None
    assert body["stdout"] == "started\n"
    assert "sleep" not in sandbox_process_names(box_client, box)


def test_exec_timeout_returns_even_if_a_leftover_holds_the_output(
    box_client: httpx.Client, box: str
) -> None:
    # A daemon that left the command's session keeps stdout open: we stop reading anyway.
    started = time.monotonic()
    body = run(box_client, box, "sh", "-c", "setsid sleep 30 & echo done", timeout_s=20)
    assert time.monotonic() - started < 5
    assert body["exit_code"] == 0 and body["stdout"] == "done\n"
    run(box_client, box, "pkill", "-x", "sleep")


def test_exec_background(box_client: httpx.Client, box: str) -> None:
    started = time.monotonic()
    body = run(box_client, box, "sleep", "600", background=True)
    assert time.monotonic() - started < 5
    assert body["exit_code"] is None and body["timed_out"] is False
    pid = body["pid"]
    assert isinstance(pid, int) and pid > 1
    comm = run(box_client, box, "cat", f"/proc/{pid}/comm")["stdout"]
    assert comm == "sleep\n"
    ppid = run(box_client, box, "sh", "-c", f"grep PPid /proc/{pid}/status")["stdout"].split()
    assert ppid == ["PPid:", "1"]  # the sandbox's init reaps it, not the host
    assert run(box_client, box, "kill", str(pid))["exit_code"] == 0
    missing = run(box_client, box, "no-such-program", background=True)
    assert missing["exit_code"] == 127 and missing["pid"] is None


def test_background_processes_end_with_the_session(
    box_server: Server, box_client: httpx.Client, api_key: str
) -> None:
    session_id = new_session(box_client)
    try:
        handle = box_server.services.manager.handle(key_id(api_key), session_id)
        assert isinstance(handle.sandbox, RuncSandbox)
        container_id = handle.sandbox.container_id
        body = run(box_client, session_id, "sh", "-c", "sleep 700 & sleep 701", background=True)
        assert body["pid"] is not None
        deadline = time.monotonic() + 5
        while len(host_pids_named("sleep", container_id)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        assert box_client.delete(f"/v1/sessions/{session_id}").status_code == 204
    assert Runc().state(container_id) is None
    assert host_pids_named("sleep", container_id) == []


def host_pids_named(name: str, container_id: str) -> list[int]:
    """Live host processes called ``name`` in the cgroup of ``container_id``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cgroup = (entry / "cgroup").read_text()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if comm == name and container_id in cgroup and state != b"Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize(
    "body",
    [
        {"cmd": []},
        {"cmd": [""]},
        {"cmd": "echo hi"},
        {"cmd": ["echo"], "shell": True},
        {"cmd": ["echo", "a\u0000b"]},
        {"cmd": ["echo"], "timeout_s": 0},
        {"cmd": ["echo"], "timeout_s": 121},
        {"cmd": ["echo"], "env": {"BAD NAME": "x"}},
        {"cmd": ["echo"], "env": {f"V{i}": "x" for i in range(200)}},
        {"cmd": ["echo"], "env": {"BIG": "x" * 70_000}},
        {"cmd": ["echo", "x" * 140_000]},
        {"cmd": ["echo"], "background": "sometimes"},
    ],
)
def test_exec_rejects_bad_bodies(box_client: httpx.Client, box: str, body: Any) -> None:
    response = box_client.post(f"/v1/sessions/{box}/exec", json=body)
    assert_error(response, 422, "invalid_request")


def test_exec_on_a_missing_session(box_client: httpx.Client) -> None:
    response = box_client.post("/v1/sessions/ses_nope/exec", json={"cmd": ["true"]})
    assert_error(response, 404, "not_found")
    assert_error(box_client.get("/v1/sessions/ses_nope/files", params={"path": "/etc/hostname"}),
                 404, "not_found")


# -- files ----------------------------------------------------------------------------------


def files_url(session_id: str) -> str:
    return f"/v1/sessions/{session_id}/files"


def test_upload_then_download_round_trips_bytes(box_client: httpx.Client, box: str) -> None:
    data = bytes(range(256)) * 16 + os.urandom(FILE_CAP - 4096)  # exactly the cap
    put = box_client.put(files_url(box), params={"path": "/tmp/data.bin"}, content=data)
    assert put.status_code == 200, put.text
    assert put.json() == {"path": "/tmp/data.bin", "size": len(data)}
    inside = run(box_client, box, "sha256sum", "/tmp/data.bin")["stdout"].split()[0]
    assert inside == hashlib.sha256(data).hexdigest()
    got = box_client.get(files_url(box), params={"path": "/tmp/data.bin"})
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.content == data
    # Streamed uploads (no Content-Length) and empty files work too; a replaced file keeps
    # its mode.
    run(box_client, box, "chmod", "0750", "/tmp/data.bin")

    def pieces() -> Iterator[bytes]:
        yield b"first "
        yield b"second"

    streamed = box_client.put(files_url(box), params={"path": "/tmp/data.bin"}, content=pieces())
    assert streamed.json()["size"] == 12
    assert run(box_client, box, "stat", "-c", "%a", "/tmp/data.bin")["stdout"] == "750\n"
    assert box_client.get(files_url(box), params={"path": "/tmp/data.bin"}).content == (
        b"first second"
    )
    assert box_client.put(files_url(box), params={"path": "/root/empty"}, content=b"").json() == {
        "path": "/root/empty", "size": 0
    }
    assert box_client.get(files_url(box), params={"path": "/root/empty"}).content == b""


def test_upload_over_the_cap(box_client: httpx.Client, box: str) -> None:
    too_big = b"x" * (FILE_CAP + 1)
    response = box_client.put(files_url(box), params={"path": "/tmp/big"}, content=too_big)
    assert_error(response, 413, "invalid_request")

    def pieces() -> Iterator[bytes]:  # no Content-Length: caught while streaming
        for _ in range(FILE_CAP // (1024 * 1024) + 1):
            yield b"y" * (1024 * 1024)

    run(box_client, box, "sh", "-c", "echo old > /tmp/kept")
    response = box_client.put(files_url(box), params={"path": "/tmp/kept"}, content=pieces())
    assert_error(response, 413, "invalid_request")
    # The old file is intact, no temporary file is left over.
    assert run(box_client, box, "cat", "/tmp/kept")["stdout"] == "old\n"
    assert "deskbox-upload" not in run(box_client, box, "ls", "-A", "/tmp")["stdout"]
    assert run(box_client, box, "test", "-e", "/tmp/big")["exit_code"] == 1


def test_download_over_the_cap(box_client: httpx.Client, box: str) -> None:
    run(box_client, box, "sh", "-c", f"head -c {FILE_CAP + 1} /dev/zero > /tmp/huge")
    response = box_client.get(files_url(box), params={"path": "/tmp/huge"})
    assert_error(response, 413, "invalid_request")
    run(box_client, box, "rm", "/tmp/huge")


@pytest.mark.parametrize("path", ["/sys/devices/system/cpu/online", "/proc/1/cmdline"])
def test_sysfs_and_proc_files_download_whole(
    box_client: httpx.Client, box: str, path: str
) -> None:
    """sysfs files say 4096 bytes and /proc's 0, whatever they hold: both arrive as `cat`
    reads them. A sysfs file's download was cut: its content-length was never filled."""
    response = box_client.get(files_url(box), params={"path": path})
    assert response.status_code == 200, response.text
    assert response.text == run(box_client, box, "cat", path)["stdout"]
    assert response.content


@pytest.mark.parametrize(
    ("method", "path", "status", "kind"),
    [
        ("GET", "tmp/relative", 422, "invalid_request"),
        ("PUT", "relative.txt", 422, "invalid_request"),
        ("GET", "", 422, "invalid_request"),
        ("GET", "/tmp/no-such-file", 404, "not_found"),
        ("PUT", "/no-such-dir/file", 404, "not_found"),
        ("GET", "/tmp", 422, "invalid_request"),
        ("PUT", "/tmp", 422, "invalid_request"),
        ("PUT", "/tmp/out/", 422, "invalid_request"),
        ("GET", "/tmp/", 422, "invalid_request"),
        ("GET", "/dev/zero", 422, "invalid_request"),
        ("PUT", "/etc/evil", 403, "forbidden"),
        ("PUT", "/evil", 403, "forbidden"),
        ("PUT", "/usr/bin/python3", 403, "forbidden"),
    ],
)
def test_file_errors(
    box_client: httpx.Client, box: str, method: str, path: str, status: int, kind: str
) -> None:
    response = box_client.request(method, files_url(box), params={"path": path},
                                  content=b"data" if method == "PUT" else None)
    error = assert_error(response, status, kind)
    if status == 403:
        assert "Read-only file system" in error["message"]


def test_file_path_parameter_is_required(box_client: httpx.Client, box: str) -> None:
    assert_error(box_client.get(files_url(box)), 422, "invalid_request")


def test_paths_resolve_inside_the_sandbox(
    box_client: httpx.Client, box: str, tmp_path: Path, box_server: Server
) -> None:
    image = session_image()
    # .. stays inside: this is the image's /etc/passwd, not the host's.
    got = box_client.get(files_url(box), params={"path": "/tmp/../../etc/passwd"})
    assert got.status_code == 200
    assert got.content == (image / "etc" / "passwd").read_bytes()

    secret = "host-secret-" + secrets.token_hex(16)
    host_file = tmp_path / "secret.txt"
    host_file.write_text(secret)
    state_dir = box_server.settings.state_dir.resolve()
    links = {
        "/tmp/to-host": str(host_file),
        "/tmp/to-host-via-proc": f"/proc/1/root{host_file}",
        "/tmp/to-self-root": f"/proc/self/root{host_file}",
        "/tmp/to-key": str(box_server.settings.api_key_path.resolve()),
        "/tmp/to-db": str(state_dir / "sessions.sqlite3"),
    }
    for link, target in links.items():
        assert run(box_client, box, "ln", "-sfn", target, link)["exit_code"] == 0
        response = box_client.get(files_url(box), params={"path": link})
        assert secret.encode() not in response.content
        assert_error(response, 404, "not_found")
        direct = box_client.get(files_url(box), params={"path": target})
        assert_error(direct, 404, "not_found")
    # Writing through a link to a host path does not reach the host either.
    put = box_client.put(files_url(box), params={"path": "/tmp/to-host"}, content=b"overwritten")
    assert put.status_code == 404
    assert host_file.read_text() == secret
    key = box_server.settings.api_key_path
    key_before = key.read_bytes()
    box_client.put(files_url(box), params={"path": str(key)}, content=b"stolen")
    assert key.read_bytes() == key_before


# -- isolation checks that need a command ---------------------------------------------------


def test_server_state_dir_and_api_key_are_unreadable(
    box_client: httpx.Client, box: str, box_server: Server, api_key: str
) -> None:
    state_dir = str(box_server.settings.state_dir.resolve())
    key_path = str(box_server.settings.api_key_path.resolve())
    for argv in (["ls", state_dir], ["cat", key_path], ["cat", state_dir + "/sessions.sqlite3"]):
        body = run(box_client, box, *argv)
        assert body["exit_code"] != 0 and "No such file or directory" in body["stderr"]
        assert api_key not in body["stdout"]
    found = run(box_client, box, "grep", "-rIl", api_key, "/tmp", "/root", "/run", "/etc")
    assert found["stdout"] == ""


def test_control_plane_port_is_unreachable(
    box_client: httpx.Client, box: str, box_server: Server
) -> None:
    port = urlsplit(box_server.url).port
    code = (
        "import socket\n"
        f"try:\n socket.create_connection(('127.0.0.1', {port}), timeout=3); print('reached')\n"
        "except OSError as e: print('refused', e.errno)\n"
    )
    assert run(box_client, box, "python3", "-c", code)["stdout"].startswith("refused")
    assert run(box_client, box, "ls", "/sys/class/net")["stdout"].split() == ["lo"]


def test_root_filesystem_is_read_only(box_client: httpx.Client, box: str) -> None:
    for path in ("/evil", "/etc/evil", "/usr/bin/evil"):
        body = run(box_client, box, "touch", path)
        assert body["exit_code"] != 0 and "Read-only file system" in body["stderr"]
    assert run(box_client, box, "touch", "/tmp/ok", "/root/ok", "/run/ok")["exit_code"] == 0


def _metric(text: str, name: str) -> float:
    found = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(found[0].split()[-1]) if found else 0.0


def test_metrics_count_exec_and_files(box_client: httpx.Client, box: str) -> None:
    exited, uploaded = 'deskbox_exec_total{outcome="exited"}', (
        'deskbox_file_bytes_total{direction="upload"}')
    before = box_client.get("/metrics").text
    run(box_client, box, "true")
    put = box_client.put(files_url(box), params={"path": "/tmp/counted"}, content=b"x" * 10)
    assert put.status_code == 200, put.text
    after = box_client.get("/metrics").text
    assert _metric(after, exited) == _metric(before, exited) + 1
    assert _metric(after, uploaded) == _metric(before, uploaded) + 10


# -- the server's caps and the agent's ceilings ---------------------------------------------


def test_caps_above_the_agents_are_refused_and_the_agents_own_serve(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A DESKBOX_FILE_MAX_BYTES over 1 GiB had the session agent refuse every file transfer
    (422 "need an absolute path= and max= within limits"), and larger output or timeout
    caps were cut to the agent's without a word: the server now refuses such caps at
    start. A server at the agent's ceilings transfers files and runs commands."""
    agent = Limits()
    assert (AGENT_MAX_FILE_BYTES, AGENT_MAX_EXEC_OUTPUT, AGENT_MAX_EXEC_TIMEOUT_S) == (
        agent.max_file_size, agent.max_exec_output, agent.max_exec_timeout_s)
    for name, ceiling in (("file_max_bytes", AGENT_MAX_FILE_BYTES),
                          ("exec_output_max_bytes", AGENT_MAX_EXEC_OUTPUT),
                          ("exec_max_timeout_s", AGENT_MAX_EXEC_TIMEOUT_S)):
        with pytest.raises(ValidationError, match=name):
            Settings(**{name: ceiling + 1})
    with container_server(tmp_path_factory, "ceilings", backends=["container"],
                          default_backend="container", file_max_bytes=AGENT_MAX_FILE_BYTES,
                          exec_output_max_bytes=AGENT_MAX_EXEC_OUTPUT,
                          exec_max_timeout_s=AGENT_MAX_EXEC_TIMEOUT_S) as server, \
            server.client(KEY_A) as client:
        session_id = new_session(client)
        try:
            put = client.put(files_url(session_id), params={"path": "/tmp/f"}, content=b"abc")
            assert put.status_code == 200, put.text
            got = client.get(files_url(session_id), params={"path": "/tmp/f"})
            assert got.status_code == 200 and got.content == b"abc"
            assert run(client, session_id, "cat", "/tmp/f",
                       timeout_s=AGENT_MAX_EXEC_TIMEOUT_S)["stdout"] == "abc"
        finally:
            client.delete(f"/v1/sessions/{session_id}")


# -- the unisolated local engine refuses ---------------------------------------------------


def test_local_backend_refuses_exec_and_files(
    client: httpx.Client, session: dict[str, Any], tmp_path: Path
) -> None:
    marker = tmp_path / "must-not-exist"
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["touch", str(marker)]})
    error = assert_error(response, 422, "invalid_request")
    assert "which the local engine lacks; its desktops are processes of the host" in (
        error["message"])
    assert not marker.exists()
    put = client.put(files_url(session["id"]), params={"path": str(marker)}, content=b"x")
    assert "the capability 'exec', which the local engine lacks" in assert_error(
        put, 422, "invalid_request")["message"]
    assert not marker.exists()
    get = client.get(files_url(session["id"]), params={"path": "/etc/hostname"})
    assert_error(get, 422, "invalid_request")


# -- a hostile neighbour ----------------------------------------------------------------------

FORK_BOMB = (
    "import os, time\n"
    "forked = refused = 0\n"
    "for _ in range(400):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(30)\n"
    "            os._exit(0)\n"
    "        forked += 1\n"
    "    except BlockingIOError:\n"
    "        refused += 1\n"
    "print(forked, refused)\n"
)
MEMORY_HOG = "b = bytearray(600 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"


def test_fork_bomb_and_memory_hog_leave_the_server_and_other_sessions_alone(
    box_server: Server, box_client: httpx.Client, box: str
) -> None:
    response = box_client.post(
        "/v1/sessions",
        json={"display": {"width": 800, "height": 600},
              "resources": {"pids": 128, "memory_mb": 384, "cpus": 0.5}},
    )
    assert response.status_code == 201, response.text
    hostile = response.json()["id"]
    try:
        bomb = run(box_client, hostile, "python3", "-c", FORK_BOMB, timeout_s=60)
        forked, refused = map(int, str(bomb["stdout"]).split())
        assert forked < 128 and refused > 0  # the pids limit held
        hog = run(box_client, hostile, "python3", "-c", MEMORY_HOG, timeout_s=60)
        assert hog["exit_code"] != 0 and "survived" not in hog["stdout"]  # OOM-killed
        # The server, the neighbour and the hostile session itself keep answering.
        with box_server.client(None) as anonymous:
            assert anonymous.get("/healthz").status_code == 200
        assert run(box_client, box, "true")["exit_code"] == 0
        shot = box_client.get(f"/v1/sessions/{box}/screenshot", params={"format": "png"})
        assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")
        state = box_client.get(f"/v1/sessions/{hostile}").json()["state"]
        assert state == "running"
    finally:
        assert box_client.delete(f"/v1/sessions/{hostile}").status_code == 204


# -- many concurrent commands at one session ------------------------------------------------


def host_runc_execs(container_id: str) -> int:
    """``runc exec`` processes the server (this process) runs for ``container_id``.

    Only its own children: for a moment, a process runc forks has runc's command line.
    """
    return len(host_runc_exec_pids(container_id))


def host_runc_exec_pids(container_id: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if (parent == os.getpid() and b"exec" in argv and container_id.encode() in argv
                and b"runc" in argv[0]):
            pids.append(int(entry.name))
    return pids


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def test_concurrent_execs_are_capped_per_session(
    box_server: Server, box_client: httpx.Client, box: str, api_key: str
) -> None:
    """40 concurrent ``sleep 2`` at one session (the attack that started 40 host runc
    processes before commands went through the agent): at most ``exec_max_concurrent``
    run, the rest get 429 at once."""
    cap = box_server.settings.exec_max_concurrent
    handle = box_server.services.manager.handle(key_id(api_key), box)
    assert isinstance(handle.sandbox, RuncSandbox)
    container_id = handle.sandbox.container_id
    neighbour = new_session(box_client)
    peak = peak_kib = 0
    sampling = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_kib
        while not sampling.is_set():
            pids = host_runc_exec_pids(container_id)
            peak = max(peak, len(pids))
            peak_kib = max(peak_kib, sum(rss_kib(pid) for pid in pids))
            time.sleep(0.02)

    def attack(_: int) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = box_client.post(f"/v1/sessions/{box}/exec",
                                   json={"cmd": ["sleep", "2"], "timeout_s": 30})
        return response, time.monotonic() - started

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(40) as pool:
            pending = pool.map(attack, range(40))
            # Meanwhile the neighbour's commands run as usual.
            assert run(box_client, neighbour, "echo", "fine")["stdout"] == "fine\n"
            answers = list(pending)
    finally:
        sampling.set()
        sampler.join()
        box_client.delete(f"/v1/sessions/{neighbour}")
    ran = [response for response, _ in answers if response.status_code == 200]
    refused = [(response, took) for response, took in answers if response.status_code != 200]
    assert 1 <= len(ran) <= cap, [r.status_code for r, _ in answers]
    assert all(r.json()["exit_code"] == 0 for r in ran)
    assert len(ran) + len(refused) == 40
    for response, took in refused:
        error = assert_error(response, 429, "capacity")
        assert "at once" in error["message"]
        assert int(response.headers["retry-after"]) >= 1
        assert took < 1.5, took  # refused at once, never queued behind the sleeps
    print(f"\n40 concurrent execs: {len(ran)} ran, {len(refused)} refused (429), at most "
          f"{peak} host runc execs at once ({peak_kib // 1024} MiB RSS together)")
    # Commands run through the sandbox's agent: no host process per command any more.
    assert peak == 0, peak
    # Every slot came back: the session runs commands again, as many as the cap at once.
    assert handle.exec_slots.in_use == 0
    with ThreadPoolExecutor(cap) as pool:
        again = list(pool.map(attack, range(cap)))
    assert [response.status_code for response, _ in again] == [200] * cap
    assert host_runc_execs(container_id) == 0


def test_file_transfers_count_and_the_live_view_does_not(
    box_server: Server, box_client: httpx.Client, box: str, api_key: str
) -> None:
    cap = box_server.settings.exec_max_concurrent
    handle = box_server.services.manager.handle(key_id(api_key), box)
    assert isinstance(handle.sandbox, RuncSandbox)
    with ThreadPoolExecutor(cap) as pool:
        sleeps = [pool.submit(run, box_client, box, "sleep", "4") for _ in range(cap)]
        deadline = time.monotonic() + 20
        while handle.exec_slots.in_use < cap:
            assert time.monotonic() < deadline, "the sleeps did not start"
            time.sleep(0.05)
        upload = box_client.put(files_url(box), params={"path": "/tmp/x"}, content=b"x")
        assert_error(upload, 429, "capacity")
        download = box_client.get(files_url(box), params={"path": "/etc/hostname"})
        assert_error(download, 429, "capacity")
        # The live view starts x11vnc with a runc exec of its own, outside the cap.
        token = box_client.post(f"/v1/sessions/{box}/tokens", json={"scope": "view"})
        assert token.status_code == 201, token.text
        vnc_ws = box_client.get(f"/v1/sessions/{box}").json()["urls"]["vnc_ws"]
        with RfbViewer(f"{vnc_ws}?token={token.json()['token']}") as viewer:
            assert viewer.full_frame().shape == (600, 800, 3)
        for done in sleeps:
            assert done.result()["exit_code"] == 0
    response = box_client.put(files_url(box), params={"path": "/tmp/x"}, content=b"x")
    assert response.status_code == 200, response.text


# -- a client that leaves -------------------------------------------------------------------


def test_commands_whose_clients_left_are_killed(
    box_server: Server, box_client: httpx.Client, box: str, api_key: str
) -> None:
    """More execs of a long ``sleep`` than the session has slots, each client giving up
    after a moment (its timeout closes its connection): every command is killed as its
    client goes and gives back its slot and the session's busy count. They ran on to their
    ``timeout_s`` before, the session answering 429 to every command and file transfer
    meanwhile, and refusing pauses and checkpoints as busy."""
    cap = box_server.settings.exec_max_concurrent
    handle = box_server.services.manager.handle(key_id(api_key), box)
    live = box_server.services.manager.holding[box]
    path = f"/v1/sessions/{box}/exec"
    left = 'deskbox_exec_total{outcome="client_left"}'
    left_before = _metric(box_client.get("/metrics").text, left)
    assert "sleep" not in sandbox_process_names(box_client, box)

    def give_up(_: int) -> int | None:
        with box_server.client(api_key) as http:
            try:
                response = http.post(path, json={"cmd": ["sleep", "60"], "timeout_s": 60},
                                     timeout=1.5)
            except httpx.ReadTimeout:
                return None
        return response.status_code

    with server_log() as records:
        with ThreadPoolExecutor(cap + 2) as pool:
            outcomes = list(pool.map(give_up, range(cap + 2)))
        gave_up = outcomes.count(None)
        # Those that found every slot taken were refused at once.
        assert gave_up >= cap and outcomes.count(429) == cap + 2 - gave_up, outcomes
        deadline = time.monotonic() + 5
        while handle.exec_slots.in_use or live.busy:
            assert time.monotonic() < deadline, (
                f"{handle.exec_slots.in_use} exec slots still taken, busy {live.busy}")
            time.sleep(0.05)
        assert run(box_client, box, "echo", "free")["stdout"] == "free\n"
        # The agent kills each command's process group when its stream is cut.
        while "sleep" in sandbox_process_names(box_client, box):
            assert time.monotonic() < deadline, "a command outlived its client"
            time.sleep(0.1)
        # Each request ended on the server then, as 499 (nginx's status for a client that
        # left) in the access log, and nothing was logged as an error.
        while access_statuses(records, "POST", path).count(499) < gave_up:
            assert time.monotonic() < deadline, access_statuses(records, "POST", path)
            time.sleep(0.05)
    statuses = access_statuses(records, "POST", path)
    assert statuses.count(499) == gave_up and statuses.count(429) == cap + 2 - gave_up
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    assert _metric(box_client.get("/metrics").text, left) == left_before + gave_up
