"""The cgroup of one VM's QEMU: its CPU quota and a memory limit with headroom.

QEMU's threads are the whole VM, so the limits of ``resources`` land on them: ``cpus`` as
a CFS quota (the guest also gets that many vCPUs, rounded up; none while the guest boots or
is restored, engine.py), ``memory_mb`` as the guest's
RAM plus what QEMU needs for itself (qemu.QEMU_OVERHEAD_MB), so the guest's own OOM killer
acts first and a runaway QEMU is stopped by the host's. The group is named
``deskbox-vm-<id>`` under each controller (the test suite's leak check looks for
``deskbox-``). Hybrid hosts (this project's CI) use the v1 cpu and memory controllers,
pure cgroup v2 hosts ``cpu.max`` and ``memory.max``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ...errors import SessionFailed

__all__ = ["VmCgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
_PERIOD_US = 100_000


@dataclass(frozen=True)
class VmCgroup:
    name: str
    root: Path = CGROUP_ROOT

    @property
    def v1(self) -> bool:
        return (self.root / "cpu").is_dir() and (self.root / "memory").is_dir()

    @property
    def directories(self) -> list[Path]:
        if self.v1:
            return [self.root / "cpu" / self.name, self.root / "memory" / self.name]
        return [self.root / self.name]

    @property
    def procs_files(self) -> list[Path]:
        """Where QEMU's jail writes its own pid (before it becomes QEMU)."""
        return [directory / "cgroup.procs" for directory in self.directories]

    def create(self, cpus: float | None, memory_bytes: int) -> None:
        """The group with its memory limit and ``cpus`` as its CPU quota (None: none, the
        host's full CPU, until set_cpus)."""
        try:
            for directory in self.directories:
                directory.mkdir(exist_ok=True)
            self._write_cpus(cpus)
            if self.v1:
                (self.directories[1] / "memory.limit_in_bytes").write_text(str(memory_bytes))
            else:
                (self.directories[0] / "memory.max").write_text(str(memory_bytes))
        except OSError as error:
            self.remove()
            raise SessionFailed(f"could not make the VM's cgroup {self.name}: {error}") from None

    def set_cpus(self, cpus: float | None) -> None:
        """The CPU quota of QEMU's threads from now on (None: none)."""
        try:
            self._write_cpus(cpus)
        except OSError as error:
            raise SessionFailed(f"could not set the CPU quota of the VM's cgroup {self.name}: "
                                f"{error}") from None

    def _write_cpus(self, cpus: float | None) -> None:
        # 1 ms per period at least: the kernel refuses less.
        quota = None if cpus is None else max(1000, int(cpus * _PERIOD_US))
        if self.v1:
            cpu = self.directories[0]
            (cpu / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
            (cpu / "cpu.cfs_quota_us").write_text("-1" if quota is None else str(quota))
        else:
            (self.directories[0] / "cpu.max").write_text(
                f"{'max' if quota is None else quota} {_PERIOD_US}")

    def pids(self) -> set[int]:
        found: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in procs.read_text().split())
        return found

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill whatever is left in the group, then remove it (idempotent)."""
        deadline = time.monotonic() + timeout_s
        for directory in self.directories:
            while directory.is_dir():
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SessionFailed(f"the VM's cgroup {directory} would not go away"
                                            ) from None
                    time.sleep(0.02)
