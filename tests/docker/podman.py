"""A Podman service of our own: Debian's Podman as the Docker-compatible Engine API
(``podman system service``) on a unix socket, with its own storage (overlay) and runtime
directories, runc as its runtime and cgroupfs as its cgroup manager (no systemd on these
machines). Used by the docker engine's tests and by bench/engines.py. With ``user``, it is
rootless Podman: the service runs as that ordinary user (``rootless_user``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Podman", "as_user", "podman_service", "rootless_user"]

SERVICE_START_S = 60.0
ROOTLESS_USER = "deskbox-rootless"


def rootless_user() -> pwd.struct_passwd:
    """An ordinary user with subordinate uid and gid ranges (what rootless Podman maps a
    container's users to), made if missing; the tests run as root."""
    start = 300000
    try:
        pwd.getpwnam(ROOTLESS_USER)
    except KeyError:
        # Not Debian's first range (100000-165535): that one is the runc sandboxes' own
        # ids, which this user could then become (engines/runc/id_overlap.py).
        subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin",
                        "-K", f"SUB_UID_MIN={start}", "-K", f"SUB_UID_MAX={start + 65535}",
                        "-K", f"SUB_GID_MIN={start}", "-K", f"SUB_GID_MAX={start + 65535}",
                        ROOTLESS_USER], check=True, capture_output=True)
    user = pwd.getpwnam(ROOTLESS_USER)
    for path, option in (("/etc/subuid", "subuids"), ("/etc/subgid", "subgids")):
        lines = Path(path).read_text().splitlines() if Path(path).exists() else []
        mine = [line for line in lines if line.startswith(f"{ROOTLESS_USER}:")]
        if mine != [f"{ROOTLESS_USER}:{start}:65536"]:  # none yet, or made by an older test
            for line in mine:
                _, first, count = line.split(":")
                subprocess.run(["usermod", f"--del-{option}",
                                f"{first}-{int(first) + int(count) - 1}", ROOTLESS_USER],
                               check=True, capture_output=True)
            subprocess.run(["usermod", f"--add-{option}", f"{start}-{start + 65535}",
                            ROOTLESS_USER], check=True, capture_output=True)
    return user


def runtime_dir(user: pwd.struct_passwd) -> Path:
    """The user's XDG_RUNTIME_DIR (no login session makes one here)."""
    path = Path(f"/run/user/{user.pw_uid}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def as_user(user: pwd.struct_passwd | None, argv: list[str],
            env: dict[str, str] | None = None) -> list[str]:
    """``argv`` run as ``user`` (none: as we are), with its home and runtime directory."""
    if user is None:
        return argv
    values = {"HOME": user.pw_dir, "XDG_RUNTIME_DIR": str(runtime_dir(user)),
              "PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})}
    return ["runuser", "-u", user.pw_name, "--", "env", "-i",
            *(f"{k}={v}" for k, v in values.items()), *argv]


@dataclass(frozen=True)
class Podman:
    url: str  # unix:///…/podman.sock, for DESKBOX_DOCKER_HOST
    storage: tuple[str, ...]  # podman's global options for the same storage (the CLI)
    log: Path
    user: pwd.struct_passwd | None = None  # rootless: the service's user

    def cli(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """The podman CLI on the service's storage (what the tests check against)."""
        return subprocess.run(as_user(self.user, ["podman", *self.storage, *args]),
                              capture_output=True, text=True, timeout=timeout_s, check=False)


@contextlib.contextmanager
def podman_service(user: pwd.struct_passwd | None = None) -> Iterator[Podman]:
    # Podman wants its runroot's path under 50 characters.
    own = Path(tempfile.mkdtemp(prefix="dbx-pm-"))
    if user is not None:
        os.chown(own, user.pw_uid, user.pw_gid)
    # A tmpdir of its own too: by default every root Podman keeps its "alive" marker in
    # /run/libpod, whatever its root. Another worker's service deletes that directory when
    # it resets; the next podman command here then takes the host for rebooted and resets
    # every running container's state to "created" (the Kubernetes stand-in then reported
    # running pods as Completed).
    storage = ("--root", str(own / "root"), "--runroot", str(own / "run"),
               "--tmpdir", str(own / "tmp"),
               "--storage-driver", "overlay", "--runtime", "runc",
               "--cgroup-manager", "cgroupfs", "--events-backend", "none")
    socket = own / "podman.sock"
    podman = Podman(f"unix://{socket}", storage, own / "service.log", user)
    with open(podman.log, "ab") as log:
        process = subprocess.Popen(
            as_user(user, ["podman", *storage, "system", "service", "--time", "0",
                           podman.url]),
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
