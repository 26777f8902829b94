"""cua-computer-server for bench/peers.py: its own venv (bench/.peers/venv), and its server.

The package is pinned in bench/peers-requirements.txt and installed from PyPI only when the
venv is missing or holds another version. It needs a Python >= 3.12 (Debian 12 has 3.11): one
given, or ``python3.12``/``python3.13`` on PATH, or pyenv's. Nothing of it is imported here:
it runs as its own process, on 127.0.0.1, with a clean environment.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
from api import free_port  # bench/api.py

__all__ = ["PeerUnavailable", "check_host", "ensure_venv", "pinned_version", "server"]

REPO = Path(__file__).resolve().parents[1]
PEER_VENV = REPO / "bench" / ".peers" / "venv"
PEER_REQUIREMENTS = REPO / "bench" / "peers-requirements.txt"
PEER_PACKAGE = "cua-computer-server"
START_TIMEOUT_S = 120.0  # its imports take several seconds on a busy host


def progress(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


class PeerUnavailable(Exception):
    """Why the cua column has no figures (printed in its rows)."""


def check_host() -> None:
    if shutil.which("xrandr") is None:
        # Its window library (pymonctl) exits with status 1 at import without xrandr.
        raise PeerUnavailable(
            "cua-computer-server needs xrandr (Debian x11-xserver-utils; make setup)")


def _tail(text: str, lines: int = 6) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _python_version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    major, minor = out.split()
    return int(major), int(minor)


def find_peer_python(explicit: str | None) -> str:
    """A Python >= 3.12: the pinned cua-computer-server needs it (Debian 12 has 3.11)."""
    candidates: list[str | None] = [explicit] if explicit else []
    candidates += [shutil.which(name) for name in ("python3.12", "python3.13")]
    for root in (Path.home() / ".pyenv" / "versions",):
        candidates += [str(p) for p in sorted(root.glob("3.1[2-9]*/bin/python3"))]
    for python in filter(None, candidates):
        version = _python_version(python)
        if version is not None and version >= (3, 12):
            return python
    raise PeerUnavailable(
        "no Python >= 3.12 found (cua-computer-server "
        f"{pinned_version()} needs one); pass --peer-python PATH"
    )


def pinned_version() -> str:
    for line in PEER_REQUIREMENTS.read_text().splitlines():
        if line.startswith(PEER_PACKAGE + "=="):
            return line.split("==", 1)[1].strip()
    return "?"


def _installed_version(python: Path) -> str | None:
    try:
        return subprocess.run(
            [str(python), "-c",
             f"import importlib.metadata as m; print(m.version({PEER_PACKAGE!r}))"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def ensure_venv(explicit_python: str | None) -> Path:
    """bench/.peers/venv with the pinned peer; made (from PyPI) only when missing or stale."""
    python = PEER_VENV / "bin" / "python"
    if python.exists() and _installed_version(python) == pinned_version():
        return python
    base = find_peer_python(explicit_python)
    progress(f"installing {PEER_PACKAGE}=={pinned_version()} into {PEER_VENV} ({base})...")
    steps = [[base, "-m", "venv", "--clear", str(PEER_VENV)],
             [str(python), "-m", "pip", "install", "--quiet", "-r", str(PEER_REQUIREMENTS)]]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise PeerUnavailable(f"{' '.join(argv[:4])}: {error}") from error
        if done.returncode != 0:
            raise PeerUnavailable(
                f"{' '.join(argv[:4])} failed ({done.returncode}): {_tail(done.stderr)}")
    return python


def _peer_env(display: str, home: Path) -> dict[str, str]:
    # A clean environment: no CONTAINER_NAME (that switches it to cloud authentication
    # against its vendor's service) and telemetry off, so nothing leaves this machine.
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "DISPLAY": display, "LANG": "C.UTF-8", "DO_NOT_TRACK": "1", "CUA_TELEMETRY": "0",
            "CUA_TELEMETRY_ENABLED": "false", "PYTHONDONTWRITEBYTECODE": "1"}


def _wait_peer(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PeerUnavailable(
                f"the peer server exited with {process.returncode}: {_tail(log.read_text())}")
        with suppress(httpx.TransportError):
            if httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise PeerUnavailable(
        f"the peer server did not answer /status in {START_TIMEOUT_S:g} s:"
        f" {_tail(log.read_text())}")


@contextmanager
def server(python: Path, display: str, workdir: Path) -> Iterator[int]:
    """``python -m computer_server`` on 127.0.0.1:<free port>; yields the port."""
    port = free_port()
    home = workdir / "cua-home"
    home.mkdir(exist_ok=True)
    log = workdir / "cua.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [str(python), "-m", "computer_server", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "warning"],
            env=_peer_env(display, home), cwd=home, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        _wait_peer(process, port, log)
        yield port
    finally:
        # Its own process group: whatever it spawned goes with it.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
