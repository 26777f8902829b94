"""A restored sandbox is handed out only once it is what its config says.

CRIU restores with ``leave-stopped`` (checkpoint.py): when ``runc restore`` returns, every
task of the sandbox is stopped. While nothing of it runs, :func:`seal` makes it safe:

1. it repairs the mounts CRIU gets wrong (mounts.py): the root read-only again, the masked
   files on the sandbox's own ``/dev/null``. A short-lived process of the host's own Python
   enters the sandbox's mount namespace for that, so no program of the sandbox ever runs
   with the host's privileges;
2. it compares the sandbox's mount table with its ``config.json``: any difference fails
   the restore;
3. the caller takes its link of the X socket (displays.py) — no sandbox process can have
   swapped the socket yet (an impostor that did so after a resume got the host's
   connection before);

and only then :func:`resume` lets the tasks run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from ..errors import SessionFailed
from .freezer import cgroup_procs, task_state
from .mounts import mismatches, parse_mountinfo, repair_commands
from .oci import RuntimeConfig

__all__ = ["resume", "seal"]

_TIMEOUT_S = 10.0

# Run by the host's Python with -I -S: single-threaded, so setns(CLONE_NEWNS) is allowed;
# after it, only system calls (no file of the sandbox is executed or imported).
_REPAIR_PROGRAM = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")
pid, repairs = int(sys.argv[1]), json.loads(sys.argv[2])
root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
check(libc.setns(namespace, 0x00020000), "setns")
os.fchdir(root)
check(libc.chroot(b"."), "chroot")
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2
KEPT = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
        "strictatime": 1 << 24}
for kind, path, options in repairs:
    target = path.encode()
    if kind == "readonly-root":
        # The other flags stay: in a user namespace they are locked, and a remount that
        # clears one is refused even to the host's root.
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for option in options:
            flags |= KEPT.get(option, 0)
        check(libc.mount(None, target, None, flags, None), f"remount {path} read-only")
    elif kind == "mask":
        check(libc.umount2(target, MNT_DETACH), f"unmount {path}")
        check(libc.mount(b"/dev/null", target, None, MS_BIND, None), f"mask {path}")
"""


def _mount_table(pid: int) -> str:
    return Path(f"/proc/{pid}/mountinfo").read_text()


def seal(container_id: str, init_pid: int, config: RuntimeConfig) -> None:
    """Repair and check the mounts of a sandbox restored stopped; SessionFailed naming the
    difference if it cannot be made what ``config`` says (the caller destroys it)."""
    pids = cgroup_procs(container_id)
    running = [pid for pid in pids if task_state(pid) not in ("T", "t", "Z", None)]
    if init_pid not in pids or running:
        raise SessionFailed(
            f"the restored sandbox {container_id} was not left stopped (running: {running})"
        )
    repairs = repair_commands(parse_mountinfo(_mount_table(init_pid)), config)
    if repairs:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", "-c", _REPAIR_PROGRAM, str(init_pid),
                 json.dumps(repairs)],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SessionFailed(f"repairing the mounts of {container_id} timed out") from None
        if done.returncode != 0:
            raise SessionFailed(f"could not repair the mounts of the restored sandbox "
                                f"{container_id}: {done.stderr.strip()[-500:]}")
    problems = mismatches(parse_mountinfo(_mount_table(init_pid)), config)
    if problems:
        raise SessionFailed(
            f"the restored sandbox {container_id} does not have the mounts of its config: "
            + "; ".join(problems)
        )


def resume(container_id: str) -> None:
    """Let every task of a sealed sandbox run."""
    for pid in cgroup_procs(container_id):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            continue
