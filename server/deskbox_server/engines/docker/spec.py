"""What the docker engine asks the Engine API for: one container's create body.

The confinement is the runc engine's, as far as the Engine API can say it: no capability,
no-new-privileges, our seccomp profile (engines/runc/seccomp.py: Podman's allowlist plus our
denials), the image read-only with tmpfs where a desktop writes, pids, memory and CPU
limits, and no network device but loopback (egress ``none``). The one host path is the
session's socket directory, where the agent listens (agent_socket.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..desktop_commands import DesktopSpec, session_env
from ..own_desktop import OWN_DISPLAY, OWN_HOME, OWN_SOCKET_DIR
from ..runc.seccomp import SeccompProfile
from .cgroups import EVERY_LIMIT, Limit

__all__ = [
    "AGENT_ARGV",
    "AGENT_SOCKET",
    "LABEL_SERVER",
    "LABEL_SESSION",
    "ContainerLimits",
    "container_body",
    "cpu_update",
]

LABEL_SESSION = "io.deskbox.session"
LABEL_SERVER = "io.deskbox.server"  # the state directory's tag: one server's containers
AGENT_SOCKET = "deskbox-agent"
AGENT_ARGV = ("/usr/local/bin/deskbox-agent", "--listen",
              f"unix:{OWN_SOCKET_DIR}/{AGENT_SOCKET}")
_MIB = 1024 * 1024
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class ContainerLimits:
    """API.md's defaults, as the runc engine's."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024
    # tmpfs sizes in MiB; their pages count against the memory limit as well.
    tmp_mb: int = 512
    home_mb: int = 512
    run_mb: int = 64
    shm_mb: int = 64
    nofile: int = 65536


def container_body(
    image: str, desktop: DesktopSpec, socket_dir: Path, limits: ContainerLimits,
    seccomp: SeccompProfile | str, labels: dict[str, str], bind_flags: bool = False,
    held: frozenset[Limit] = EVERY_LIMIT, boost: bool = False, rootless: bool = False,
) -> dict[str, Any]:
    """The body of ``POST /containers/create``.

    ``seccomp``: the profile itself (Docker takes its JSON in SecurityOpt), or the path of
    a file holding it on the daemon's host (Podman's compatible API reads a path there).
    ``bind_flags``: mount the socket directory nosuid, nodev, noexec (Podman takes these
    in a bind's options; Docker refuses them there). ``held``: the limits the daemon's
    cgroups enforce (cgroups.py), the only ones asked for (Docker refuses a CPU quota it
    cannot enforce); without ``pids`` nothing caps one session's processes (see the
    ``nproc`` ulimit below). ``boost``: no CPU quota yet (the
    start-up runs at the host's full CPU, as on the runc engine); the engine applies
    ``limits.cpus`` once the desktop is ready (:func:`cpu_update`). ``rootless``: the
    daemon runs as an ordinary user (no ``nproc`` ulimit, below).
    """
    profile = seccomp if isinstance(seccomp, str) else json.dumps(seccomp, sort_keys=True)
    memory = limits.memory_mb * _MIB

    def tmpfs(size_mb: int, mode: str, *extra: str) -> str:
        return ",".join(("rw", "nosuid", "nodev", *extra, f"mode={mode}", f"size={size_mb}m"))

    cgroup_limits = {
        **({"PidsLimit": limits.pids} if Limit.PIDS in held else {}),
        # No swap: the limit is the limit.
        **({"Memory": memory, "MemorySwap": memory} if Limit.MEMORY in held else {}),
        **({"NanoCpus": int(limits.cpus * 1e9)} if Limit.CPU in held and not boost else {}),
    }
    return {
        "Image": image,
        "Hostname": "deskbox",
        "Env": [f"{name}={value}" for name, value in {
            "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": OWN_HOME, "LANG": "C.UTF-8",
            **session_env(desktop, OWN_DISPLAY, AGENT_ARGV),
        }.items()],
        "Labels": labels,
        "WorkingDir": "/",
        "NetworkDisabled": True,
        "HostConfig": {
            "NetworkMode": "none",
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges", f"seccomp={profile}"],
            "ReadonlyRootfs": True,
            "Tmpfs": {
                "/tmp": tmpfs(limits.tmp_mb, "1777"),
                "/run": tmpfs(limits.run_mb, "755"),
                OWN_HOME: tmpfs(limits.home_mb, "700"),
                "/dev/shm": tmpfs(limits.shm_mb, "1777", "noexec"),
            },
            # The only host path: the X server's and the agent's sockets are made here.
            "Binds": [f"{socket_dir}:{OWN_SOCKET_DIR}:rw" + (",nosuid,nodev,noexec" * bind_flags)],
            **cgroup_limits,
            "Ulimits": _ulimits(limits, rootless),
            "IpcMode": "private",
            # deskbox-session writes its logs into the sandbox (/run/deskbox), never to the
            # host; nothing comes out on stdout.
            "LogConfig": {"Type": "none", "Config": {}},
            "RestartPolicy": {"Name": "no"},
            "AutoRemove": False,
            "Init": False,  # deskbox-session is the init: it reaps everything
        },
    }


def _ulimits(limits: ContainerLimits, rootless: bool) -> list[dict[str, Any]]:
    """Rootful Podman 4.3's defaults for both are above what its runtime may set here ("error
    setting rlimit type 7", "type 6"), so a rootful container gets both; above the daemon's
    own hard limits the start fails with its message (a 502).

    ``nproc`` is never one session's cap: the kernel counts RLIMIT_NPROC per user in a user
    namespace. A rootful container's processes are the host's root, which it does not
    apply to. Every rootless container's are the daemon's user in one user namespace (the
    rootless pause process's), the daemon's own processes with them: the session's pids as
    nproc there would be one budget for all the sessions together (a second container could
    not fork once the first ran its pids' worth). So a rootless container gets none and
    keeps the daemon's own limit, as Podman before 5.5 does anyway (its compatible API drops
    a rootless container's Ulimits); its pids limit is the cgroup's, where it has one.
    """
    ulimits = [{"Name": "nofile", "Soft": limits.nofile, "Hard": limits.nofile}]
    if not rootless:
        ulimits.append({"Name": "nproc", "Soft": limits.pids, "Hard": limits.pids})
    return ulimits


def cpu_update(
    limits: ContainerLimits, podman: bool, held: frozenset[Limit] = EVERY_LIMIT
) -> dict[str, Any]:
    """The body of the update that gives a started container its CPU quota.

    Docker's ``POST /containers/{id}/update`` takes the quota in its Resources (not NanoCpus,
    which it refuses to set over a container made with a period or quota, and vice versa).
    Podman 4.3's compatible API has no such call: its own ``/libpod/containers/{id}/update``
    takes the OCI resources, and keeps what it is given as the container's; so memory and
    pids go along, unchanged (those of ``held``, the limits the container was made with).
    """
    quota = max(1000, int(limits.cpus * CPU_PERIOD_US))  # 1 ms: the kernel's least
    if not podman:
        return {"CpuPeriod": CPU_PERIOD_US, "CpuQuota": quota}
    memory = limits.memory_mb * _MIB
    return {"cpu": {"quota": quota, "period": CPU_PERIOD_US},
            **({"memory": {"limit": memory, "swap": memory}} if Limit.MEMORY in held else {}),
            **({"pids": {"limit": limits.pids}} if Limit.PIDS in held else {})}
