"""A ``deskbox serve`` subprocess for tests that kill their server (SIGKILL is the point)."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from deskbox_server.app import runc_engine
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import remove_orphans
from deskbox_server.settings import Settings

from ..docker.podman import as_user
from ..images import IMAGE_STATE_DIR

__all__ = ["KEY", "container_of", "deskbox_as", "free_port", "init_of", "reap",
           "remove_sandboxes", "runc_session", "serve", "serve_refused"]

KEY = "restart-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(
    state_dir: Path, log: Path, extra_env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0, ready_timeout_s: float = 60.0,
    user: pwd.struct_passwd | None = None, open_files: int | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """``deskbox serve`` on a free loopback port; killed at the end if still running.
    ``extra_env``: more ``DESKBOX_*`` settings; ``timeout_s``: of each request;
    ``ready_timeout_s``: until it answers (its engines prepared); ``user``: run as that
    ordinary user (Debian's python3 with this venv's packages: the venv's own interpreter
    lives under /root, which no other user may enter); ``open_files``: the soft limit it
    starts with (util-linux's prlimit; this process runs servers in threads, where a
    preexec_fn is unsafe)."""
    port = free_port()
    settings = {"DESKBOX_API_KEYS": KEY, "DESKBOX_IMAGE_STATE_DIR": str(IMAGE_STATE_DIR),
                "DESKBOX_REAPER_INTERVAL_S": "0.5", **(extra_env or {})}
    args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--state-dir", str(state_dir)]
    if user is None:
        argv, env = [str(Path(sys.executable).parent / "deskbox"), *args], {**os.environ,
                                                                            **settings}
    else:
        argv, env = deskbox_as(user, args, settings), dict(os.environ)
    if open_files is not None:
        argv = ["prlimit", f"--nofile={open_files}:", "--", *argv]
    with open(log, "ab") as output:
        process = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s,
                          headers={"Authorization": f"Bearer {KEY}"}) as http:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the server did not start"
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            yield process, http
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def deskbox_as(user: pwd.struct_passwd, args: list[str], settings: Mapping[str, str]
               ) -> list[str]:
    """The argv of ``deskbox ARGS`` run as ``user`` with ``settings`` in its environment:
    this venv's packages through the system's python3, which the user may run."""
    launch = ("import site, sys; site.addsitedir(sys.argv.pop(1)); "
              "from deskbox.cli import main; sys.exit(main())")
    site_packages = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    # PYTHONPATH: for the image build the server runs with its own interpreter.
    return as_user(user, ["/usr/bin/python3", "-c", launch, str(site_packages), *args],
                   {**settings, "PYTHONPATH": str(site_packages)})


def reap(pids: list[int], timeout_s: float = 10.0) -> None:
    """Collect sandbox inits that reparented to us when their server was killed."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # not ours (reaped elsewhere) or gone
            if done:
                break
            time.sleep(0.05)


def container_of(session_id: str) -> str:
    """The runc container of a served session: the server names it
    ``deskbox-<hash of its state dir>-<session id>``."""
    ids = [cid for cid in Runc().list_ids() if cid.endswith("-" + session_id)]
    assert len(ids) == 1, ids
    return ids[0]


def init_of(session_id: str) -> int:
    """The pid of a served session's sandbox init, which reparents to this process (a
    subreaper, see tests/conftest.py) when its server is killed: for ``reap``."""
    state = Runc().state(container_of(session_id))
    assert state is not None
    return state.pid


def runc_session(http: httpx.Client, body: Mapping[str, Any] | None = None
                 ) -> tuple[str, int]:
    """A session made on a served runc engine (``body``: what is posted, {} unless told):
    its id and its sandbox init's pid."""
    made = http.post("/v1/sessions", json=dict(body or {}))
    assert made.status_code == 201, made.text
    session_id: str = made.json()["id"]
    return session_id, init_of(session_id)


def remove_sandboxes(state_dir: Path, inits: list[int]) -> None:
    """Whatever a test of killed servers left: no sandbox of ``state_dir`` outlives it, and
    the ``inits`` that reparented to this process are collected."""
    remove_orphans(runc_engine(Settings(state_dir=state_dir)).options, keep=())
    reap(inits)


def serve_refused(state_dir: Path, extra_env: Mapping[str, str]) -> str:
    """A ``deskbox serve`` that must not start (an engine it cannot prepare): its output,
    once it exited with a failure."""
    env = {**os.environ, "DESKBOX_API_KEYS": KEY, "DESKBOX_IMAGE_STATE_DIR": str(IMAGE_STATE_DIR),
           **extra_env}
    ended = subprocess.run(
        [str(Path(sys.executable).parent / "deskbox"), "serve", "--host", "127.0.0.1",
         "--port", str(free_port()), "--state-dir", str(state_dir)],
        env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ended.returncode != 0, ended.stdout + ended.stderr
    return ended.stdout + ended.stderr
