"""Commands inside a runc sandbox: ``runc exec`` with the sandbox's own process spec.

Each command runs as the sandbox's processes run: the ``process`` object of the bundle's
``config.json`` (no capabilities, no_new_privileges, the same rlimits), in the container's
namespaces, cgroup and seccomp filter, with only ``args``, ``env`` (plus ``DISPLAY``) and
perhaps ``cwd`` replaced. The host only starts runc (its own binary) and reads pipes.

A command is started by a small program of the image (``EXEC_PROGRAM``, run by the image's
python3) that runc makes a session leader: it forks the command with our pipes (passed by
``--preserve-fds``, not copied by runc) as stdout and stderr, waits for it and reports how
it ended on its own stdout. So runc returns when the command does, even if a process it
left behind keeps the output open; we then read for at most ``DRAIN_GRACE_S`` more and
close our ends.

When the timeout passes, the command's process tree is SIGKILLed from the host
(``process_tree.kill_process_tree``: its session and descendants in the sandbox's pid
namespace). A process that left both (setsid + double fork) survives until the sandbox
ends, confined to it like everything else there.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import json
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Conflict, DesktopFailed, Timeout
from ..sandbox_io import ExecCommand, ExecResult
from .exec_slots import ExecSlot, ExecSlots
from .pipes import CappedBuffer, PipeReader, pipe
from .process_tree import Child, kill_process_tree
from .runc import Runc

__all__ = ["BACKGROUND_PROGRAM", "DRAIN_GRACE_S", "EXEC_PROGRAM", "PYTHON", "Launch",
           "SandboxExec"]

DRAIN_GRACE_S = 0.5
_START_TIMEOUT_S = 30.0
_LOG_LIMIT = 64 * 1024
_HIDDEN_ENV = "DESKBOX_"  # the launcher's own variables: not for commands
_STATUS_LIMIT = 64
_BACKGROUND_STATUS = re.compile(rb"^(PID|ERR) ([0-9]{1,9})\n$")
_EXEC_STATUS = re.compile(rb"^(EXIT|SIGNAL|ERR) ([0-9]{1,9})\n$")
PYTHON = "/usr/bin/python3"

# Runs the command (argv[1:]) with stdin /dev/null and fds 3 and 4 (our pipes) as its
# stdout and stderr, waits for it and reports "EXIT n", "SIGNAL n" or "ERR errno" (exec
# failed, told through a close-on-exec pipe) on its own stdout. It is the session leader.
EXEC_PROGRAM = r"""
import os, sys
r, w = os.pipe2(os.O_CLOEXEC)
pid = os.fork()
if pid == 0:
    os.close(r)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(3, 1)
    os.dup2(4, 2)
    os.close(null)
    os.close(3)
    os.close(4)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        os.write(w, b"%d" % (e.errno or 1))
    os._exit(127)
os.close(w)
os.close(3)
os.close(4)
error = os.read(r, 16)
_, status = os.waitpid(pid, 0)
if error:
    sys.stdout.write("ERR %d\n" % int(error))
elif os.WIFSIGNALED(status):
    sys.stdout.write("SIGNAL %d\n" % os.WTERMSIG(status))
else:
    sys.stdout.write("EXIT %d\n" % os.WEXITSTATUS(status))
"""

# Forks the command into a session of its own with /dev/null for stdio, reports its pid
# (or why exec failed, through a close-on-exec pipe) and exits.
BACKGROUND_PROGRAM = r"""
import os, sys
r, w = os.pipe2(os.O_CLOEXEC)
pid = os.fork()
if pid == 0:
    os.close(r)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        os.write(w, b"%d" % (e.errno or 1))
    os._exit(127)
os.close(w)
error = os.read(r, 16)
if error:
    os.waitpid(pid, 0)
    sys.stdout.write("ERR %d\n" % int(error))
else:
    sys.stdout.write("PID %d\n" % pid)
"""


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

    def check_sandbox(self, runc_error: str) -> None:
        """Raise when runc could not exec because of the sandbox's state."""
        lowered = runc_error.lower()
        if "paused" in lowered:
            raise Conflict(f"the sandbox {self.container_id} is paused")
        if "not running" in lowered or "stopped" in lowered or "does not exist" in lowered:
            raise DesktopFailed(f"the sandbox {self.container_id} is not running: {runc_error}")

    def failed_start(self, launch: Launch) -> int:
        """For a program runc could not start: raise for the sandbox, or an exit code."""
        message = launch.runc_error()
        self.check_sandbox(message)
        return 127 if "not found" in message.lower() else 126

    async def run(self, command: ExecCommand) -> ExecResult:
        """Run ``command`` to its end (or its timeout), or start it in the background."""
        if command.background:
            return await self._run_background(command)
        started = time.monotonic()
        outcome = await self._capture(
            [PYTHON, "-I", "-S", "-c", EXEC_PROGRAM, *command.argv], command.env,
            command.timeout_s, command.output_limit,
        )
        status = _EXEC_STATUS.match(outcome.status)
        exit_code: int | None = None
        stderr = outcome.stderr.value()
        if outcome.timed_out:
            pass
        elif status is not None and status[1] == b"EXIT":
            exit_code = int(status[2])
        elif status is not None and status[1] == b"SIGNAL":
            exit_code = 128 + int(status[2])
        elif status is not None and status[1] == b"ERR":
            number = int(status[2])
            exit_code = 127 if number == errno.ENOENT else 126
            stderr = _cannot_run(command.argv[0], number)[:command.output_limit]
        else:  # the launcher did not run or was killed: say what runc said
            exit_code = outcome.returncode if outcome.returncode is not None else 126
            stderr = (outcome.runc_error.encode() + b"\n")[:command.output_limit]
        return ExecResult(
            exit_code=exit_code,
            stdout=outcome.stdout.value(),
            stderr=stderr,
            stdout_truncated=outcome.stdout.truncated,
            stderr_truncated=outcome.stderr.truncated,
            timed_out=outcome.timed_out,
            duration_s=time.monotonic() - started,
        )

    async def _capture(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, limit: int
    ) -> _Outcome:
        """Run the launcher ``argv`` with our pipes for the command's output (fds 3, 4)."""
        status_read, status_write = pipe()
        out_read, out_write = pipe()
        err_read, err_write = pipe()
        readers = (PipeReader(status_read), PipeReader(out_read), PipeReader(err_read))
        try:
            launch = await self.launch(
                argv, env, stdout=status_write, extra=(out_write, err_write)
            )
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        finally:
            for fd in (status_write, out_write, err_write):
                os.close(fd)
        outcome = _Outcome(
            CappedBuffer(_STATUS_LIMIT), CappedBuffer(limit), CappedBuffer(limit)
        )
        buffers = (outcome.status_buffer, outcome.stdout, outcome.stderr)
        drains = [
            asyncio.create_task(buffer.drain(reader))
            for buffer, reader in zip(buffers, readers, strict=True)
        ]
        try:
            try:
                await asyncio.wait_for(launch.wait(), timeout_s)
            except TimeoutError:
                outcome.timed_out = True
                await launch.kill()
            await asyncio.wait(drains, timeout=DRAIN_GRACE_S)
            outcome.returncode = launch.returncode
            if not launch.started():
                outcome.runc_error = launch.runc_error()
                self.check_sandbox(outcome.runc_error)
        finally:
            for task in drains:
                task.cancel()
            await asyncio.gather(*drains, return_exceptions=True)
            for reader in readers:
                reader.close()
            if launch.returncode is None:  # cancelled: leave nothing running
                await asyncio.shield(launch.kill())
            launch.cleanup()
        return outcome

    async def _run_background(self, command: ExecCommand) -> ExecResult:
        """Start the command through ``BACKGROUND_PROGRAM``, which forks it and exits.

        So the command is a child of the sandbox's init (which reaps it), never of runc:
        an orphan of runc would be reparented to our server (a subreaper), outside.
        """
        started = time.monotonic()
        outcome = await self._capture(
            [PYTHON, "-I", "-S", "-c", BACKGROUND_PROGRAM, *command.argv], command.env,
            _START_TIMEOUT_S, _STATUS_LIMIT,
        )
        if outcome.timed_out:
            raise Timeout("the sandbox did not start the command in time")
        status = _BACKGROUND_STATUS.match(outcome.status)
        elapsed = time.monotonic() - started
        if status is not None and status[1] == b"PID":
            return ExecResult(exit_code=None, pid=int(status[2]), duration_s=elapsed)
        if status is not None:
            number = int(status[2])
            return ExecResult(exit_code=127 if number == errno.ENOENT else 126,
                              stderr=_cannot_run(command.argv[0], number), duration_s=elapsed)
        message = (outcome.runc_error or "the sandbox could not start the command") + "\n"
        return ExecResult(exit_code=126, stderr=message.encode(), duration_s=elapsed)


@dataclass
class _Outcome:
    status_buffer: CappedBuffer
    stdout: CappedBuffer
    stderr: CappedBuffer
    timed_out: bool = False
    returncode: int | None = None
    runc_error: str = ""

    @property
    def status(self) -> bytes:
        return self.status_buffer.value()


def _cannot_run(program: str, number: int) -> bytes:
    reason = os.strerror(number) if 0 < number < 4096 else f"error {number}"
    return f"deskbox: cannot run {program!r}: {reason}\n".encode()
