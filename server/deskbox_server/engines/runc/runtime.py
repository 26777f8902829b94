"""A thin, typed wrapper of the ``runc`` command line (the only place that runs it)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import SessionFailed

__all__ = ["ContainerState", "Runc"]

_OUTPUT_LIMIT = 1 << 20
_LIST_ATTEMPTS = 5
_LIST_RETRY_S = 0.02


@dataclass(frozen=True)
class ContainerState:
    id: str
    status: str  # creating | created | running | paused | stopped
    pid: int


class Runc:
    def __init__(self, binary: str = "runc", root: Path | None = None) -> None:
        self.binary = binary
        self.root = root

    def command(self) -> list[str]:
        """``runc`` with its global options, for callers that add a subcommand."""
        argv = [self.binary]
        if self.root is not None:
            argv += ["--root", str(self.root)]
        return argv

    def _argv(self, *args: str, log: Path | None = None) -> list[str]:
        argv = self.command()
        if log is not None:
            argv += ["--log", str(log), "--log-format", "json"]
        return [*argv, *args]

    def _run(
        self, args: Sequence[str], timeout_s: float = 30.0, log: Path | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """SessionFailed if runc does not answer in time (a sandbox's removal then goes on
        with its other steps, and says why it could not finish)."""
        try:
            return subprocess.run(
                self._argv(*args, log=log), stdin=subprocess.DEVNULL, capture_output=True,
                timeout=timeout_s, check=False,
            )
        except subprocess.TimeoutExpired:
            raise SessionFailed(f"runc {args[0]} did not answer within {timeout_s:g} s"
                                ) from None

    def run_detached(self, container_id: str, bundle: Path, pid_file: Path) -> None:
        """``runc run --detach``: returns once the container's process has started.

        The container inherits runc's stdio, so it gets /dev/null; runc's own messages go
        to ``bundle/runc.log``.
        """
        log = bundle / "runc.log"
        try:
            done = subprocess.run(
                self._argv("run", "--detach", "--bundle", str(bundle), "--pid-file",
                           str(pid_file), container_id, log=log),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=60, check=False,
            )
        except subprocess.TimeoutExpired:
            raise SessionFailed("runc did not start the sandbox within 60 s") from None
        if done.returncode != 0:
            raise SessionFailed(f"runc could not start the sandbox: {_last_error(log)}")

    def state(self, container_id: str) -> ContainerState | None:
        done = self._run(["state", container_id])
        if done.returncode != 0:
            return None
        raw = json.loads(done.stdout[:_OUTPUT_LIMIT])
        return ContainerState(str(raw["id"]), str(raw["status"]), int(raw.get("pid", 0)))

    def list_ids(self) -> list[str]:
        """Every container of runc's root. ``runc list`` fails when a container it walks
        is deleted meanwhile (another server or sandbox ending on this host): it is asked
        again, and only a failure that persists gives an empty list."""
        for attempt in range(_LIST_ATTEMPTS):
            done = self._run(["list", "--format", "json"])
            if done.returncode == 0:
                raw = json.loads(done.stdout[:_OUTPUT_LIMIT] or b"null") or []
                return [str(item["id"]) for item in raw]
            time.sleep(_LIST_RETRY_S * (attempt + 1))
        return []

    def set_cpus(self, container_id: str, cpus: float, period_us: int) -> None:
        """``runc update``: the sandbox's CPU quota, in CPUs, from now on."""
        quota = max(1000, int(cpus * period_us))
        done = self._run(
            ["update", "--cpu-period", str(period_us), "--cpu-quota", str(quota), container_id]
        )
        if done.returncode != 0:
            message = done.stderr[-2000:].decode(errors="replace").strip()
            raise SessionFailed(f"runc could not limit the CPU of {container_id}: {message}")

    def set_pids(self, container_id: str, limit: int) -> None:
        """``runc update``: the sandbox's pids limit from now on (it may be below what it
        holds: then nothing of it can start a process or thread until some end)."""
        done = self._run(["update", "--pids-limit", str(limit), container_id])
        if done.returncode != 0:
            message = done.stderr[-2000:].decode(errors="replace").strip()
            raise SessionFailed(f"runc could not limit the pids of {container_id}: {message}")

    def kill(self, container_id: str, signal: str = "KILL") -> None:
        self._run(["kill", "--all", container_id, signal])

    def delete(self, container_id: str) -> None:
        """``runc delete --force``; succeeds when the container is already gone."""
        done = self._run(["delete", "--force", container_id])
        if done.returncode != 0 and self.state(container_id) is not None:
            message = done.stderr[-2000:].decode(errors="replace").strip()
            raise SessionFailed(f"runc could not delete {container_id}: {message}")


def _last_error(log: Path) -> str:
    try:
        lines = log.read_bytes()[-_OUTPUT_LIMIT:].decode(errors="replace").splitlines()
    except OSError:
        return "no log"
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg", line))
    return lines[-1] if lines else "no log"
