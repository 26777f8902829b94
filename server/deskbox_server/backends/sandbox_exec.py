"""Long-lived programs inside a runc sandbox: ``runc exec`` with the sandbox's own process
spec. Only the live view's x11vnc starts this way now (vnc_server.py): the host holds its
process and reads its log. Commands and files go through the sandbox's agent
(sandbox_agent.py).

Each program runs as the sandbox's processes run: the ``process`` object of the bundle's
``config.json`` (no capabilities, no_new_privileges, the same rlimits), in the container's
namespaces, cgroup and seccomp filter, with only ``args``, ``env`` (plus ``DISPLAY``) and
perhaps ``cwd`` replaced. The host only starts runc (its own binary) and reads pipes.

:meth:`Launch.kill` SIGKILLs the program's process tree from the host
(``process_tree.kill_process_tree``: its session and descendants in the sandbox's pid
namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import DesktopFailed
from .exec_slots import ExecSlot, ExecSlots
from .process_tree import Child, kill_process_tree
from .runc import Runc

__all__ = ["Launch", "SandboxExec"]

_LOG_LIMIT = 64 * 1024
_HIDDEN_ENV = "DESKBOX_"  # the launcher's own variables: not for programs

@dataclass
class Launch:
    """One ``runc exec`` started by :meth:`SandboxExec.launch`; always ``cleanup()`` it."""

    runc: Child
    files: tuple[Path, Path, Path]  # process spec, pid file, runc log
    pidns: str
    slot: ExecSlot | None = None
    _leader: int | None = field(default=None, init=False)

    @property
    def pid_file(self) -> Path:
        return self.files[1]

    @property
    def returncode(self) -> int | None:
        """runc's exit status: the program's (128 + N for signal N), 255 if it never ran."""
        return self.runc.returncode

    async def wait(self) -> int:
        return await self.runc.wait()

    def leader(self) -> int | None:
        """The program's pid on the host, once runc has started it (runc writes it)."""
        if self._leader is None:
            with contextlib.suppress(OSError, ValueError):
                self._leader = int(self.pid_file.read_text().strip())
        return self._leader

    def started(self) -> bool:
        return self.leader() is not None

    def runc_error(self) -> str:
        """The last error runc logged (why the program did not start), or ""."""
        try:
            with self.files[2].open("rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - _LOG_LIMIT))
                lines = log.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        for line in reversed(lines):
            with contextlib.suppress(ValueError, AttributeError):
                entry = json.loads(line)
                if entry.get("level") in ("error", "fatal"):
                    return str(entry.get("msg", ""))[:2000]
        return ""

    async def kill(self) -> None:
        """SIGKILL the program's process tree, then runc itself if it lingers."""
        leader = self.leader()
        if leader is not None:
            await asyncio.to_thread(kill_process_tree, leader, self.pidns)
        if self.returncode is None:
            try:
                await asyncio.wait_for(self.wait(), 5.0)
            except TimeoutError:
                self.runc.kill()
                await self.wait()

    def cleanup(self) -> None:
        """Remove runc's files and give the session's slot back (runc has exited by now)."""
        for path in self.files:
            with contextlib.suppress(OSError):
                path.unlink()
        if self.slot is not None:
            self.slot.release()


class SandboxExec:
    """Runs commands in one sandbox (``container_id``, whose bundle is ``bundle``).

    With ``slots``, every launch takes one of them (Capacity when none is free).
    """

    def __init__(
        self, runc: Runc, container_id: str, bundle: Path, display: str, init_pid: int,
        slots: ExecSlots | None = None,
    ) -> None:
        self.runc = runc
        self.container_id = container_id
        self.bundle = bundle
        self.display = display
        self.init_pid = init_pid
        self.slots = slots
        self._base: dict[str, Any] | None = None

    def _base_process(self) -> dict[str, Any]:
        """The sandbox's process spec (from the bundle we wrote; the sandbox cannot)."""
        if self._base is None:
            config = json.loads((self.bundle / "config.json").read_text())
            process = config["process"]
            assert isinstance(process, dict)
            self._base = process
        return self._base

    def process_spec(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None
    ) -> dict[str, Any]:
        spec = copy.deepcopy(self._base_process())
        merged: dict[str, str] = {}
        for entry in spec.get("env", []):
            key, _, value = str(entry).partition("=")
            if not key.startswith(_HIDDEN_ENV):
                merged[key] = value
        merged["DISPLAY"] = self.display
        merged.update(env)
        spec["args"] = list(argv)
        spec["env"] = [f"{key}={value}" for key, value in merged.items()]
        spec["terminal"] = False
        if cwd is not None:
            spec["cwd"] = cwd
        return spec

    def _pidns(self) -> str:
        try:
            return os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            raise DesktopFailed(f"the sandbox {self.container_id} is not running") from None

    async def launch(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | None = None,
        stdin: int | None = None,
        stdout: int | None = None,
        stderr: int | None = None,
        extra: Sequence[int] = (),
    ) -> Launch:
        """Start ``runc exec``. ``stdin``/``stdout``/``stderr`` reach the program through
        runc's copying pipes (None: /dev/null); ``extra`` descriptors are passed as they are
        at 3, 4, ... The caller closes its copies of the ends it passed.
        """
        pidns = self._pidns()
        slot = self.slots.take() if self.slots is not None else None
        token = secrets.token_hex(8)
        files = (
            self.bundle / f"exec-{token}.json",
            self.bundle / f"exec-{token}.pid",
            self.bundle / f"exec-{token}.log",
        )
        try:
            fd = os.open(files[0], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as spec_file:
                json.dump(self.process_spec(argv, env or {}, cwd), spec_file)
            args = [
                *self.runc.command(), "--log", str(files[2]), "--log-format", "json", "exec",
                "--preserve-fds", str(len(extra)),
                "--process", str(files[0]), "--pid-file", str(files[1]), self.container_id,
            ]
            null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            try:
                stdio = [null if fd is None else fd for fd in (stdin, stdout, stderr)]
                fds = {number: fd for number, fd in enumerate([*stdio, *extra])}
                child = Child(args, fds)
            finally:
                os.close(null)
        except BaseException:
            for path in files:
                with contextlib.suppress(OSError):
                    path.unlink()
            if slot is not None:
                slot.release()
            raise
        return Launch(child, files, pidns, slot)
