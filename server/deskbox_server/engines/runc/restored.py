"""A restored sandbox is handed out only once it is what its config says.

CRIU restores with ``leave-stopped`` (checkpoint.py): when ``runc restore`` returns, every
task of the sandbox is stopped. While nothing of it runs, :func:`seal` makes it safe:

1. it repairs the mounts CRIU gets wrong (mounts.py): the root read-only again, the masked
   files on the sandbox's own ``/dev/null``. A short-lived process of the host's own Python
   enters the sandbox's mount namespace for that (mount_repair.py), so no program of the
   sandbox ever runs with the host's privileges;
2. it compares the sandbox's mount table with its ``config.json``: any difference fails
   the restore;
3. the caller takes its link of the X socket (displays.py) and of the agent's socket
   (agent_link.py) — no sandbox process can have swapped either yet (an impostor that did
   so after a resume got the host's connection before);

and only then :func:`resume` lets the tasks run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...errors import SessionFailed
from .freezer import cgroup_procs, task_state
from .layout import RuntimeConfig
from .mounts import mismatches, parse_mountinfo, repair_commands

__all__ = ["resume", "seal"]

_TIMEOUT_S = 10.0
_STOPPING_S = 2.0

# Run by the host's Python, isolated: mount_repair.py says why in a process of its own.
_REPAIR_SCRIPT = Path(__file__).with_name("mount_repair.py")


def _mount_table(pid: int) -> str:
    return Path(f"/proc/{pid}/mountinfo").read_text()


def seal(container_id: str, init_pid: int, config: RuntimeConfig) -> None:
    """Repair and check the mounts of a sandbox restored stopped; SessionFailed naming the
    difference if it cannot be made what ``config`` says (the caller destroys it)."""
    # A task CRIU lets go with SIGSTOP pending is "R" or "D" until it takes the signal,
    # which it does before it runs an instruction of its own; with 8 restores at once on 2
    # cores that outlasted `runc restore` (bench/rl.py). So wait for the stops, briefly.
    deadline = time.monotonic() + _STOPPING_S
    while True:
        pids = cgroup_procs(container_id)
        running = [pid for pid in pids if task_state(pid) not in ("T", "t", "Z", None)]
        if init_pid in pids and not running:
            break
        if time.monotonic() > deadline:
            raise SessionFailed(
                f"the restored sandbox {container_id} was not left stopped (running: {running})"
            )
        time.sleep(0.01)
    repairs = repair_commands(parse_mountinfo(_mount_table(init_pid)), config)
    if repairs:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-S", str(_REPAIR_SCRIPT), str(init_pid),
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
