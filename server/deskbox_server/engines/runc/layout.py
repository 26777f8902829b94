"""The OCI runtime ``config.json`` of one session sandbox.

What a sandbox gets, and why:

- the image's root filesystem, read-only; tmpfs on /tmp, /run, /root (the home), /dev/shm,
  so everything a session writes lives in its own memory (charged to its cgroup) and
  disappears with it;
- one host path: the session's socket directory, at /tmp/.X11-unix, where the X server's
  socket appears (the host reserves its number) and the agent's socket; and the
  session's persistent volumes, if it has any (ext4 images the host mounted, bound where
  the session asked, under its home or /tmp);
- its own pid, mount, ipc, uts, cgroup and network namespaces. Its cgroup namespace is
  rooted at its own cgroup, so /proc/self/cgroup shows "/" and not the host's
  ``/deskbox-<id>`` layout (and a restored copy sees its new cgroup as "/" too). The
  network namespace is empty (loopback only) for egress ``none``, else the one
  ``engines/network.py`` made on the host (and ``/etc/hosts`` and ``/etc/resolv.conf``
  are the host's files for it, read-only);
- its own user namespace (``user_ids``) where the network namespace is its own too (egress
  ``none``; container.py says why not otherwise): uid and gid 0 inside are
  ``SANDBOX_USER_IDS[0]`` of the host, an id no host process uses and no tool hands out
  (the constant says why), and the 65536 ids from there back the rest. So a process that
  escaped every other bound is an unprivileged user of the host, and the image (owned by
  the host's root, "nobody" inside) is not writable to it whatever its mount flags.
  Per-user kernel counts (inotify instances, ...) are still charged to the namespace's
  owner, the host's root. Every host path the sandbox's processes open themselves (CRIU
  restores its mounts and reads its images from inside the namespace) must be reachable
  by that gid;
- cgroup limits on cpu, memory and pids; no capabilities; no_new_privileges; the seccomp
  profile of ``seccomp.py`` (an allowlist read from a Debian package: a sandbox whose
  profile cannot be read does not start); the masked and read-only /proc paths of runc's
  default spec.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from .seccomp import PODMAN_PROFILE, SeccompProfile, seccomp_profile

__all__ = [
    "MASKED_PATHS",
    "Hook",
    "READONLY_PATHS",
    "RuntimeConfig",
    "SANDBOX_USER_IDS",
    "SOCKET_DIR",
    "Limits",
    "SandboxConfig",
    "SandboxTemplate",
    "config_json",
    "host_root_gid",
    "memory_limit",
    "set_cpu_quota",
    "write_bundle",
    "write_config",
]

SOCKET_DIR = "/tmp/.X11-unix"

# runc's default spec, plus what Docker also hides.
MASKED_PATHS: tuple[str, ...] = (
    "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/devices/virtual/powercap",
)
READONLY_PATHS: tuple[str, ...] = (
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
)

CPU_PERIOD_US = 100_000
# (first host id, count): ids 0..count-1 inside every sandbox are these on the host. A
# range no tool of the host hands out: shadow's useradd grants /etc/subuid ranges from
# 100000 up to 600100000 (login.defs), systemd-nspawn picks container ranges below
# 0x70000000 and keeps 0x7FFE0000-0x7FFEFFFF for "foreign" files; 0x70000000-0x7FFDFFFF
# is unused by both (systemd.io/UIDS-GIDS). Its users could otherwise become the sandboxes'
# ids (newuidmap) and reach every session. Checkpoints keep the ids they were taken with
# (CRIU restores the user namespace it dumped): see ``host_root_gid``.
SANDBOX_USER_IDS = (0x7FF0_0000, 65_536)


@dataclass(frozen=True)
class Limits:
    """cgroup limits; the defaults are API.md's."""

    cpus: float = 1.0
    memory_mb: int = 2048
    pids: int = 1024


@dataclass(frozen=True)
class SandboxConfig:
    rootfs: Path
    socket_dir: Path  # on the host; mounted at SOCKET_DIR
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = Limits()
    cgroups_path: str = ""
    hostname: str = "deskbox"
    home: str = "/root"
    # tmpfs sizes in MiB; their pages count against the memory limit as well.
    tmp_mb: int = 512
    home_mb: int = 512
    run_mb: int = 64
    shm_mb: int = 64
    # At most the caller's hard limit: raising it needs CAP_SYS_RESOURCE, which the host's
    # root may lack.
    nofile: int = 65536
    # Egress ``all``/``allowlist``: join this host-made network namespace (engines/network.py)
    # instead of a new empty one, and see these host files read-only (destination, source).
    network_namespace: Path | None = None
    files: tuple[tuple[str, Path], ...] = ()
    # Persistent volumes, mounted on the host already: (destination, source, read-only).
    volumes: tuple[tuple[str, Path, bool], ...] = ()
    # The Podman seccomp profile our own (seccomp.py) is made from.
    seccomp_source: Path = PODMAN_PROFILE
    # None: no user namespace (uid 0 inside is the host's root, without capabilities).
    user_ids: tuple[int, int] | None = SANDBOX_USER_IDS


class Mount(TypedDict, total=False):
    destination: str
    type: str
    source: str
    options: list[str]


class _Process(TypedDict):
    terminal: bool
    user: dict[str, int]
    args: list[str]
    env: list[str]
    cwd: str
    capabilities: dict[str, list[str]]
    rlimits: list[dict[str, str | int]]
    noNewPrivileges: bool
    oomScoreAdj: int


class _Resources(TypedDict):
    devices: list[dict[str, str | bool]]
    memory: dict[str, int]
    cpu: dict[str, int]
    pids: dict[str, int]


class IdMapping(TypedDict):
    containerID: int
    hostID: int
    size: int


class _Linux(TypedDict):
    namespaces: list[dict[str, str]]
    uidMappings: NotRequired[list[IdMapping]]
    gidMappings: NotRequired[list[IdMapping]]
    cgroupsPath: str
    resources: _Resources
    seccomp: SeccompProfile
    maskedPaths: list[str]
    readonlyPaths: list[str]


class Hook(TypedDict):
    path: str
    args: list[str]


class RuntimeConfig(TypedDict):
    ociVersion: str
    process: _Process
    root: dict[str, str | bool]
    hostname: str
    mounts: list[Mount]
    linux: _Linux
    annotations: NotRequired[dict[str, str]]
    hooks: NotRequired[dict[str, list[Hook]]]


def _tmpfs(destination: str, size_mb: int, mode: str, *extra: str) -> Mount:
    return {
        "destination": destination, "type": "tmpfs", "source": "tmpfs",
        "options": ["nosuid", "nodev", *extra, f"mode={mode}", f"size={size_mb}m"],
    }


def runtime_config(config: SandboxConfig) -> RuntimeConfig:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": config.home, "LANG": "C.UTF-8"}
    env.update(config.env)
    limits = config.limits
    memory = limits.memory_mb * 1024 * 1024
    mounts: list[Mount] = [
        {"destination": "/proc", "type": "proc", "source": "proc",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        _tmpfs("/dev/shm", config.shm_mb, "1777", "noexec"),
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
        _tmpfs("/tmp", config.tmp_mb, "1777"),
        _tmpfs("/run", config.run_mb, "755"),
        _tmpfs(config.home, config.home_mb, "700"),
        # The only host path: the X server's and the agent's sockets are made here.
        {"destination": SOCKET_DIR, "type": "bind", "source": str(config.socket_dir),
         "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]},
    ]
    mounts += [
        {"destination": destination, "type": "bind", "source": str(source),
         "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}
        for destination, source in config.files
    ]
    # After the home's tmpfs: a volume at /root/work is mounted on it, not under it.
    mounts += [
        {"destination": destination, "type": "bind", "source": str(source),
         "options": ["bind", "ro" if read_only else "rw", "nosuid", "nodev"]}
        for destination, source, read_only in config.volumes
    ]
    namespaces = [
        {"type": kind} for kind in ("pid", "mount", "ipc", "uts", "cgroup", "network")
    ]
    if config.network_namespace is not None:
        namespaces[-1]["path"] = str(config.network_namespace)
    raw: RuntimeConfig = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(config.args),
            "env": [f"{key}={value}" for key, value in env.items()],
            "cwd": config.home,
            # No capability at all, also in the sandbox's own user namespace.
            "capabilities": {
                "bounding": [], "effective": [], "inheritable": [], "permitted": [],
                "ambient": [],
            },
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": config.nofile, "soft": config.nofile},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
            ],
            "noNewPrivileges": True,
            # If the host runs out of memory, a session goes before the control plane.
            "oomScoreAdj": 500,
        },
        "root": {"path": str(config.rootfs), "readonly": True},
        "hostname": config.hostname,
        "mounts": mounts,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": config.cgroups_path,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": _memory(memory),
                "cpu": _cpu(limits.cpus),
                "pids": {"limit": limits.pids},
            },
            "seccomp": seccomp_profile(config.seccomp_source),
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
    if config.user_ids is not None:
        first, count = config.user_ids
        raw["linux"]["namespaces"].append({"type": "user"})
        raw["linux"]["uidMappings"] = [{"containerID": 0, "hostID": first, "size": count}]
        raw["linux"]["gidMappings"] = [{"containerID": 0, "hostID": first, "size": count}]
    return raw


def host_root_gid(config: RuntimeConfig) -> int | None:
    """The host gid of gid 0 inside the sandbox, or None without a user namespace."""
    for mapping in config["linux"].get("gidMappings", []):
        if mapping["containerID"] == 0:
            return mapping["hostID"]
    return None


def memory_limit(bundle_dir: Path) -> int:
    """The memory limit in bytes of the sandbox of ``bundle_dir`` (its tmpfs files count in
    it too); API.md's default where its config is unreadable or names none."""
    try:
        config: RuntimeConfig = json.loads((bundle_dir / "config.json").read_text())
        return int(config["linux"]["resources"]["memory"]["limit"])
    except (OSError, ValueError, KeyError, TypeError):
        return Limits().memory_mb << 20


def set_cpu_quota(bundle_dir: Path, cpus: float) -> None:
    """The CPU quota in the sandbox's ``config.json`` from now on: a restore (a hibernated
    session's resume, also by the next server) makes the sandbox's cgroup from that file,
    which still held the start-up's quota (the host's full CPU)."""
    path = bundle_dir / "config.json"
    config: RuntimeConfig = json.loads(path.read_text())
    config["linux"]["resources"]["cpu"] = _cpu(cpus)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(path)  # a server killed midway leaves the old file, never half of one


def config_json(config: SandboxConfig) -> str:
    return json.dumps(runtime_config(config), indent=2)


# CRIU reads its options for `runc checkpoint`/`restore` of this sandbox from this file of
# the bundle (the annotation below; engines/runc/criu.py writes it).
CRIU_CONFIG = "criu.conf"


def write_bundle(bundle_dir: Path, config: SandboxConfig) -> Path:
    """Write ``config.json`` into ``bundle_dir`` (created, mode 0700); returns its path."""
    return write_config(bundle_dir, runtime_config(config))


def write_config(bundle_dir: Path, raw: RuntimeConfig) -> Path:
    bundle_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = bundle_dir / "config.json"
    raw["annotations"] = {"org.criu.config": str(bundle_dir.resolve() / CRIU_CONFIG)}
    path.write_text(json.dumps(raw, indent=2))
    return path


@dataclass(frozen=True)
class SandboxTemplate:
    """What restoring a checkpoint into a new sandbox needs besides CRIU's images.

    CRIU restores the processes into the mounts and namespaces they had, so the copy's
    config is the dumped sandbox's own; only the host-side paths and the cgroup are the
    copy's (:meth:`for_copy`). Its X server keeps its display number (``inner_display``).
    """

    config: RuntimeConfig
    inner_display: int
    # The X server's pid inside the sandbox (kept by CRIU): a restored copy's X socket
    # must lead to that process. None for snapshots taken before it was recorded.
    xserver_pid: int | None = None

    @classmethod
    def of_bundle(
        cls, bundle_dir: Path, inner_display: int, xserver_pid: int | None = None
    ) -> SandboxTemplate:
        config: RuntimeConfig = json.loads((bundle_dir / "config.json").read_text())
        return cls(config, inner_display, xserver_pid)

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "inner_display": self.inner_display,
                           "xserver_pid": self.xserver_pid})

    @classmethod
    def from_json(cls, text: str) -> SandboxTemplate:
        raw = json.loads(text)
        pid = raw.get("xserver_pid")
        return cls(raw["config"], int(raw["inner_display"]), None if pid is None else int(pid))

    @property
    def network_namespace(self) -> str | None:
        """The host-made network namespace the dumped sandbox joined, if any."""
        for namespace in self.config["linux"]["namespaces"]:
            if namespace["type"] == "network":
                return namespace.get("path")
        return None

    @property
    def rootfs(self) -> Path:
        return Path(str(self.config["root"]["path"]))

    def for_copy(
        self, socket_dir: Path, cgroups_path: str, limits: Limits,
        seccomp_source: Path = PODMAN_PROFILE,
    ) -> RuntimeConfig:
        """The copy's config. Its seccomp profile is today's: CRIU gives restored processes
        the filter they were dumped with, and ``runc exec`` in the copy uses this one."""
        config: RuntimeConfig = json.loads(json.dumps(self.config))
        config["linux"]["seccomp"] = seccomp_profile(seccomp_source)
        for mount in config["mounts"]:
            if mount["destination"] == SOCKET_DIR:
                mount["source"] = str(socket_dir)
        config["linux"]["cgroupsPath"] = cgroups_path
        resources = config["linux"]["resources"]
        resources["memory"] = _memory(limits.memory_mb * 1024 * 1024)
        resources["cpu"] = _cpu(limits.cpus)
        resources["pids"] = {"limit": limits.pids}
        config.pop("annotations", None)
        return config


_SWAP_COUNTED = Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")  # cgroup v1


def _cpu(cpus: float) -> dict[str, int]:
    """A CFS quota of ``cpus`` CPUs; 1 ms per period at least (the kernel's minimum)."""
    return {"quota": max(1000, int(cpus * CPU_PERIOD_US)), "period": CPU_PERIOD_US}


def _memory(limit: int) -> dict[str, int]:
    """The cgroup's memory, and memory plus swap at the same bound where the host counts
    swap (no swap for a sandbox: on a host with swap, its tmpfs files and a memory hog
    went to the host's swap past the limit instead of meeting the OOM killer; the docker
    engine's spec says the same). A host that does not count swap has no file to write."""
    if _SWAP_COUNTED.exists() or any(Path("/sys/fs/cgroup").glob("*/memory.swap.max")):
        return {"limit": limit, "swap": limit}
    return {"limit": limit}
