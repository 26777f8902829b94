"""The docker engine's tests run against a real Engine API: Debian's Podman, as the
compatible service (``podman system service``) on a unix socket of the package's own, with
its own storage (overlay) and runtime directories, runc as its runtime and cgroupfs as its
cgroup manager (no systemd here). No Docker daemon runs on these machines.

The service is started once for the package; its containers and storage go at the end.
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

import pytest

from deskbox_server.engines.image import build_image
from deskbox_server.settings import default_recipe_dir

from ..images import IMAGE_STATE_DIR, progress

SERVICE_START_S = 60.0


def oci_image() -> Path:
    """The current recipe's OCI image directory (``images/oci-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress, timeout_s=1800,
                       script_name="oci_image.py")


@dataclass(frozen=True)
class Podman:
    url: str  # unix:///…/podman.sock, for DESKBOX_DOCKER_HOST
    storage: tuple[str, ...]  # podman's global options for the same storage (the CLI)
    log: Path

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """The podman CLI on the service's storage (what the tests check against)."""
        return subprocess.run(["podman", *self.storage, *args], capture_output=True,
                              text=True, timeout=timeout_s, check=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        oci_image()


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


@pytest.fixture(scope="package")
def podman() -> Iterator[Podman]:
    with podman_service() as service:
        yield service
