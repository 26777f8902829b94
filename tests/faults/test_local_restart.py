"""The local engine's desktops when their server is killed: its processes and files must
not outlive the next server's start, which fails their sessions as ended with the server.

The servers run as ``deskbox serve`` subprocesses (SIGKILL is the point).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from ..api.conftest import DISPLAY
from ..api.served import reap, serve

pytestmark = pytest.mark.slow


LOCAL = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}


def _children(parent: int) -> dict[int, dict[str, str]]:
    """The processes ``parent`` started for desktops (those a local desktop marks), with
    their environments."""
    found: dict[int, dict[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(e.decode(errors="replace").partition("=")[::2] for e in environ if e)
        if ppid == parent and "DESKBOX_PROCESS_SET" in env:
            found[int(entry.name)] = env
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_killed_servers_local_desktops_are_removed_by_the_next(tmp_path: Path) -> None:
    """They ran on for good, unowned (an Xvfb, an openbox, a Chromium and an agent each),
    while the next server said they had ended with it."""
    state = tmp_path / "state"
    log = tmp_path / "server.log"
    left: dict[int, dict[str, str]] = {}
    workdirs: set[Path] = set()
    try:
        with serve(state, log, LOCAL) as (first, http):
            made = http.post("/v1/sessions", json={"display": DISPLAY})
            assert made.status_code == 201, made.text
            sid = made.json()["id"]
            left = _children(first.pid)
            assert len(left) >= 4, left  # Xvfb, openbox, Chromium, the agent
            workdirs = {Path(env["XDG_RUNTIME_DIR"]) for env in left.values()
                        if "XDG_RUNTIME_DIR" in env}
            assert workdirs and all(d.is_dir() for d in workdirs), workdirs
            first.send_signal(signal.SIGKILL)
            first.wait()
        with serve(state, log, LOCAL) as (_, http):
            body = http.get(f"/v1/sessions/{sid}").json()
            assert body["state"] == "failed", body
            deadline = time.monotonic() + 10
            while (alive := [pid for pid in left if _alive(pid)]) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not alive, [left[pid].get("_", pid) for pid in alive]
            assert not [d for d in workdirs if d.exists()], workdirs
    finally:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        reap(list(left))
        for directory in workdirs:
            shutil.rmtree(directory, ignore_errors=True)
