"""A Podman service of our own: Debian's Podman as the Docker-compatible Engine API
(``podman system service``) on a unix socket, with its own storage (overlay) and runtime
directories, runc as its runtime and cgroupfs as its cgroup manager (no systemd on these
machines). Used by the docker engine's tests and by bench/engines.py.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Podman", "podman_service"]

SERVICE_START_S = 60.0


@dataclass(frozen=True)
class Podman:
    url: str  # unix:///…/podman.sock, for DESKBOX_DOCKER_HOST
    storage: tuple[str, ...]  # podman's global options for the same storage (the CLI)
    log: Path

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """The podman CLI on the service's storage (what the tests check against)."""
        return subprocess.run(["podman", *self.storage, *args], capture_output=True,
                              text=True, timeout=timeout_s, check=False)


@contextlib.contextmanager
def podman_service() -> Iterator[Podman]:
    # Podman wants its runroot's path under 50 characters.
    own = Path(tempfile.mkdtemp(prefix="dbx-pm-"))
    storage = ("--root", str(own / "root"), "--runroot", str(own / "run"),
               "--storage-driver", "overlay", "--runtime", "runc",
               "--cgroup-manager", "cgroupfs", "--events-backend", "none")
    socket = own / "podman.sock"
    podman = Podman(f"unix://{socket}", storage, own / "service.log")
    with open(podman.log, "ab") as log:
        process = subprocess.Popen(
            ["podman", *storage, "system", "service", "--time", "0", podman.url],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + SERVICE_START_S
        while not socket.exists():
            assert process.poll() is None, podman.log.read_text()[-3000:]
            assert time.monotonic() < deadline, "podman's service did not listen"
            time.sleep(0.05)
        yield podman
    finally:
        # What a failed test left, then the storage's mounts.
        podman.cli("rm", "--all", "--force", "--time", "0")
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        podman.cli("system", "reset", "--force")
        shutil.rmtree(own, ignore_errors=True)
