"""QEMU's confinement, after Firecracker's jailer (data/jail.sh does the work).

Each VM's QEMU runs in new mount, pid and network namespaces (``unshare``), in its own
cgroups (cgroup.py), as a user of its own with no capability and ``no_new_privs``, and
sees a root that holds only ``/usr`` (read-only), ``/dev/null``-like nodes (``/dev/kvm``
with KVM), the guest's image files (read-only) and its runtime directory. With egress
``none`` its network namespace is new and empty: the guest has no NIC, and QEMU itself
could not reach a network if it were subverted. With ``all``/``allowlist`` it joins the
session's host-made namespace (pasta and nftables, as a container's). QEMU's own
``-sandbox`` (seccomp) comes on top (qemu.py).

User ids: one per live VM, from :data:`FIRST_UID` up, so that a subverted QEMU cannot
signal or trace another VM's. They have no passwd entry; nothing needs one.
"""

from __future__ import annotations

import threading
from importlib import resources
from pathlib import Path

__all__ = ["FIRST_UID", "JAIL_DIR", "UidPool", "jail_argv"]

FIRST_UID = 1_700_000_000
_UID_COUNT = 1_000_000
JAIL_DIR = Path("/run/deskbox-vm/.jail")  # an empty mount point, used in private


def _script() -> str:
    return str(resources.files("deskbox_server.engines.vm") / "data" / "jail.sh")


def jail_argv(readonly: list[Path], runtime: Path, uid: int, kvm: bool,
              procs_files: list[Path], netns: Path | None = None) -> list[str]:
    """The command line QEMU's own is appended to: ``readonly`` are the only host files
    (the guest's) it sees besides ``/usr`` and its ``runtime`` directory. ``netns``: the
    host-made network namespace of egress all/allowlist; else a new, empty one."""
    JAIL_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    network = ["--net"] if netns is None else []
    enter = [] if netns is None else ["nsenter", f"--net={netns}"]
    argv = [
        *enter, "unshare", "--mount", "--pid", *network, "--ipc", "--uts", "--fork",
        "--kill-child=SIGKILL",
        "/bin/sh", _script(), str(JAIL_DIR), str(runtime), str(uid), "1" if kvm else "0",
    ]
    for path in readonly:
        if any(c.isspace() for c in str(path)):
            raise ValueError(f"the VM's file {path} has a blank in its path")
        argv += ["ro", str(path)]
    for procs in procs_files:
        argv += ["cgroup", str(procs)]
    return [*argv, "--"]


class UidPool:
    """The user ids of live VMs; the lowest free one for each new VM."""

    def __init__(self) -> None:
        self._taken: set[int] = set()
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            for uid in range(FIRST_UID, FIRST_UID + _UID_COUNT):
                if uid not in self._taken:
                    self._taken.add(uid)
                    return uid
        raise RuntimeError("no VM user id is free")

    def claim(self, uid: int) -> None:
        """Mark ``uid`` taken: a VM adopted from a previous server keeps its user."""
        with self._lock:
            self._taken.add(uid)

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._taken.discard(uid)
