"""Freeze and thaw every process of a sandbox through the cgroup freezer.

A sandbox's cgroup is ``/<container id>`` under each controller (container.py). With the
v1 freezer controller mounted (this host: hybrid cgroups), its ``freezer.state`` is used:
writing ``FROZEN`` starts freezing, reading it says ``FREEZING`` until every task has
stopped. On a pure v2 host the cgroup's ``cgroup.freeze`` is used and ``cgroup.events``
says ``frozen 1`` once done. ``runc pause``/``runc resume`` do the same (runc state then
reports ``paused``), at the cost of a process start (~10 ms) each; writing the files
directly takes well under a millisecond.

Nothing here talks to the sandbox: a frozen X server answers nothing, so callers must not
make X calls between :func:`freeze` and :func:`thaw`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from ...errors import SessionFailed

__all__ = ["CGROUP_ROOT", "cgroup_procs", "freeze", "frozen", "stopped_tasks", "task_state", "thaw"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_SPIN_S = 0.0002  # between reads while the kernel is still freezing tasks


def _v1(container_id: str, root: Path) -> Path | None:
    path = root / "freezer" / container_id / "freezer.state"
    return path if (root / "freezer").is_dir() else None


def _v2(container_id: str, root: Path) -> Path:
    return root / container_id / "cgroup.freeze"


def _write(path: Path, value: str, container_id: str) -> None:
    try:
        with path.open("w") as file:
            file.write(value)
    except FileNotFoundError:
        raise SessionFailed(f"the sandbox {container_id} has no freezer cgroup") from None
    except OSError as error:
        raise SessionFailed(
            f"could not write {value.strip()} to the freezer of {container_id}: {error}"
        ) from None


def _v1_state(path: Path) -> str:
    return path.read_text().strip()


def _v2_frozen(freeze_file: Path) -> bool:
    for line in (freeze_file.parent / "cgroup.events").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "frozen":
            return value.strip() == "1"
    return False


def freeze(container_id: str, timeout_s: float = 5.0, root: Path = CGROUP_ROOT) -> None:
    """Stop every task of the sandbox; returns once all are frozen.

    If they are not all frozen within ``timeout_s`` (a task stuck in the kernel), the
    sandbox is thawed again and SessionFailed says so: it is never left half frozen.
    """
    deadline = time.monotonic() + timeout_s
    v1 = _v1(container_id, root)
    if v1 is not None:
        _write(v1, "FROZEN", container_id)

        def done() -> bool:
            state = _v1_state(v1)
            if state == "FREEZING":  # v1 may need the write repeated to finish
                _write(v1, "FROZEN", container_id)
            return state == "FROZEN"
    else:
        v2 = _v2(container_id, root)
        _write(v2, "1", container_id)

        def done() -> bool:
            return _v2_frozen(v2)

    while not done():
        if time.monotonic() > deadline:
            with contextlib.suppress(SessionFailed):
                thaw(container_id, root)
            raise SessionFailed(
                f"the sandbox {container_id} did not freeze within {timeout_s:g} s"
            )
        time.sleep(_SPIN_S)


def thaw(container_id: str, root: Path = CGROUP_ROOT) -> None:
    """Let the sandbox's tasks run again (harmless when it is not frozen)."""
    v1 = _v1(container_id, root)
    if v1 is not None:
        _write(v1, "THAWED", container_id)
    else:
        _write(_v2(container_id, root), "0", container_id)


def frozen(container_id: str, root: Path = CGROUP_ROOT) -> bool:
    """Whether the sandbox is frozen now (False when it has no freezer cgroup)."""
    try:
        v1 = _v1(container_id, root)
        if v1 is not None:
            return _v1_state(v1) == "FROZEN"
        return _v2_frozen(_v2(container_id, root))
    except OSError:
        return False


def cgroup_procs(container_id: str, root: Path = CGROUP_ROOT) -> list[int]:
    """The host pids of every process of the sandbox (its freezer cgroup's members)."""
    v1 = _v1(container_id, root)
    procs = (v1.parent if v1 is not None else _v2(container_id, root).parent) / "cgroup.procs"
    try:
        return [int(pid) for pid in procs.read_text().split()]
    except FileNotFoundError:
        raise SessionFailed(f"the sandbox {container_id} has no cgroup") from None


def task_state(pid: int) -> str | None:
    """The kernel's one-letter state of process ``pid`` ("T": stopped), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold any byte, ")" too: the state follows the last ")".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()


def stopped_tasks(container_id: str, root: Path = CGROUP_ROOT) -> list[int]:
    """The sandbox's processes stopped by a signal (SIGSTOP) or a tracer, as host pids.

    CRIU hangs on such a process in a frozen cgroup (until runc's timeout), so a checkpoint
    checks first. Reads only the kernel's files (cgroup.procs, /proc/<pid>/stat).
    """
    try:
        pids = cgroup_procs(container_id, root)
    except (SessionFailed, OSError, ValueError):
        return []
    return [pid for pid in pids if task_state(pid) in ("T", "t")]
