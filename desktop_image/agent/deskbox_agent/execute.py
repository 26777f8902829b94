"""``POST /v1/exec``: a command inside the sandbox, its output streamed as it comes.

The command is the session leader of its own process group (``start_new_session``), so a
timeout or a host that stops listening kills the whole group. Output past the cap is read
and dropped (a command never blocks on a full pipe because of the cap) and flagged.

A long-lived server started this way (the session's VNC server) asks for ``stop_grace_s``:
it is then stopped with SIGTERM first and SIGKILL only after that grace, because some
programs free what outlives them only on a signal they handle (x11vnc's SysV shared
memory segments).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .fdwait import wait_readable
from .h2server import Stream
from .limits import Limits
from .records import EXIT, MAX_RECORD, STDERR, STDOUT, record
from .registry import Json

__all__ = ["ExecSpec", "install_child_watcher", "parse_exec", "run_exec"]

DRAIN_GRACE_S = 0.5  # output read after the command ended (a child may hold the pipe)
MAX_STOP_GRACE_S = 60.0
_MAX_ARGS = 4096
_MAX_ENV = 256


class ExecSpec:
    def __init__(
        self, cmd: list[str], env: dict[str, str], cwd: str | None, timeout_s: float,
        max_output: int, stop_grace_s: float = 0.0,
    ) -> None:
        self.cmd = cmd
        self.env = env
        self.cwd = cwd
        self.timeout_s = timeout_s
        self.max_output = max_output
        self.stop_grace_s = stop_grace_s


def _strings(value: object) -> bool:
    return isinstance(value, str) and "\x00" not in value


def parse_exec(body: Mapping[str, Json], limits: Limits) -> ExecSpec | str:
    """The request, or why it is refused."""
    unknown = set(body) - {"cmd", "env", "cwd", "timeout_s", "max_output", "stop_grace_s"}
    if unknown:
        return f"unknown fields: {sorted(unknown)}"
    cmd = body.get("cmd")
    if not (isinstance(cmd, list) and 0 < len(cmd) <= _MAX_ARGS and all(map(_strings, cmd))):
        return "cmd must be a non-empty list of strings without NUL"
    args = [str(a) for a in cmd]
    if not args[0]:
        return "cmd[0] may not be empty"
    env = body.get("env", {})
    if not (isinstance(env, dict) and len(env) <= _MAX_ENV and all(
        _strings(k) and k and "=" not in k and _strings(v) for k, v in env.items()
    )):
        return "env must be an object of strings without NUL (names without '=')"
    cwd = body.get("cwd")
    if cwd is not None and not (_strings(cwd) and cwd):
        return "cwd must be a non-empty string"
    timeout = body.get("timeout_s", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
        0 < timeout <= limits.max_exec_timeout_s
    ):
        return f"timeout_s must be a number in (0, {limits.max_exec_timeout_s}]"
    cap = body.get("max_output", limits.max_exec_output)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= limits.max_exec_output:
        return f"max_output must be an integer in [0, {limits.max_exec_output}]"
    grace = body.get("stop_grace_s", 0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not (
        0 <= grace <= MAX_STOP_GRACE_S
    ):
        return f"stop_grace_s must be a number in [0, {MAX_STOP_GRACE_S:g}]"
    return ExecSpec(args, {str(k): str(v) for k, v in env.items()},
                    None if cwd is None else str(cwd), float(timeout), cap, float(grace))


class _Pump:
    """Reads one pipe into records; ``reading_since`` tells an idle pipe from a full queue."""

    def __init__(
        self, pipe: asyncio.StreamReader, kind: bytes, cap: int, out: asyncio.Queue[bytes | None],
    ) -> None:
        self.pipe, self.kind, self.cap, self.out = pipe, kind, cap, out
        self.truncated = False
        self.reading_since: float | None = None
        self.waited_s = 0.0  # for the host to take records (flow control), in all

    async def run(self) -> None:
        sent = 0
        loop = asyncio.get_running_loop()
        while True:
            self.reading_since = loop.time()
            chunk = await self.pipe.read(MAX_RECORD)
            self.reading_since = None
            if not chunk:
                return
            keep = chunk[: max(0, self.cap - sent)]
            if len(keep) < len(chunk):
                self.truncated = True
            if keep:
                sent += len(keep)
                waiting_since = loop.time()
                await self.out.put(record(self.kind, keep))
                self.waited_s += loop.time() - waiting_since


async def run_exec(stream: Stream, spec: ExecSpec) -> None:
    env = dict(os.environ)
    env.update(spec.env)
    try:
        proc = await asyncio.create_subprocess_exec(
            *spec.cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=spec.cwd, start_new_session=True,
            limit=MAX_RECORD,
        )
    except OSError as e:
        if e.errno == errno.EAGAIN:  # the fork, at the pids limit: 429 (registry.py)
            raise
        await stream.error(422, "exec_failed", f"cannot run {spec.cmd[0]!r}: {e.strerror}")
        return
    assert proc.stdout is not None and proc.stderr is not None
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=4)
    readers = [
        _Pump(proc.stdout, STDOUT, spec.max_output, queue),
        _Pump(proc.stderr, STDERR, spec.max_output, queue),
    ]
    pumps = [asyncio.create_task(r.run()) for r in readers]
    timed_out = False

    async def wait() -> None:
        nonlocal timed_out
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                await _exited(proc)
        except TimeoutError:
            timed_out = True
            await _stop(proc, spec.stop_grace_s)
            await _exited(proc)
        # A child left behind may keep a pipe open, silent or writing all the time (a
        # server started with `&`): once the command is gone, each pipe is read for
        # DRAIN_GRACE_S more, not counting waits for the host to take the output (what
        # the command wrote before it exited is not lost to a slow host), and never past
        # the exec's own timeout.
        ended = loop.time()
        last_call = max(deadline, ended) + DRAIN_GRACE_S
        waited_before = [reader.waited_s for reader in readers]
        while not all(p.done() for p in pumps):
            await asyncio.wait(pumps, timeout=0.05)
            now = loop.time()
            for reader, pump, waited in zip(readers, pumps, waited_before, strict=True):
                reading = reader.reading_since is not None
                drained_s = now - ended - (reader.waited_s - waited)
                if now >= last_call or (reading and drained_s >= DRAIN_GRACE_S):
                    pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for _ in pumps:
            await queue.put(None)

    waiter = asyncio.create_task(wait())
    completed = False
    try:
        await stream.respond(200, "application/x-deskbox-records")
        open_pipes = 2
        while open_pipes:
            item = await queue.get()
            if item is None:
                open_pipes -= 1
            else:
                await stream.write(item)
        await waiter
        code = proc.returncode
        status = {
            "exit_code": None if timed_out or code is None or code < 0 else code,
            "signal": -code if code is not None and code < 0 and not timed_out else None,
            "timed_out": timed_out,
            "stdout_truncated": readers[0].truncated,
            "stderr_truncated": readers[1].truncated,
        }
        await stream.write(record(EXIT, json.dumps(status).encode()), end=True)
        completed = True
    finally:
        try:
            if proc.returncode is None:
                await _stop(proc, spec.stop_grace_s)
            elif not completed:
                # Stopped (a reset, the connection's end) after the command exited: what
                # it left in its group goes too, as it would have with the command.
                _kill_group(proc.pid)
        finally:
            for task in [*pumps, waiter]:
                task.cancel()
            # Our ends of the pipes, even if the stop above was cut short: a child left
            # behind may hold theirs open for as long as it likes, and asyncio lets the
            # process go only once both are closed.
            transport = getattr(proc, "_transport", None)
            if isinstance(transport, asyncio.SubprocessTransport):
                transport.close()
            await asyncio.gather(*pumps, waiter, return_exceptions=True)
        with contextlib.suppress(ProcessLookupError):
            await _exited(proc)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Until the command itself has exited and was reaped.

    Not ``proc.wait()``: that also waits until its output pipes are closed (Python 3.11's
    asyncio wakes it only then), which a process the command left behind may delay for
    as long as it runs. The pidfd tells the exit at once; the child watcher then reaps it
    and sets ``returncode`` moments later.
    """
    if proc.returncode is not None:
        return
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:
        pidfd = -1  # reaped already: returncode is about to be set
    if pidfd >= 0:
        try:
            await wait_readable(pidfd)
        finally:
            os.close(pidfd)
    delay = 0.0005
    while proc.returncode is None:
        await asyncio.sleep(delay)
        delay = min(0.05, delay * 2)


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _stop(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM to the group and up to ``grace_s`` for the command to exit, then SIGKILL to
    the group (what ignored SIGTERM, or was left behind by the command, goes too).

    The SIGKILL is in a ``finally``: a stop that is itself cancelled (the connection ends
    while a reset stream's command is in its grace) still kills.
    """
    try:
        if grace_s > 0:
            _kill_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await _exited(proc)
    finally:
        # Called while the leader runs; if it exited in its grace, a group that still has
        # members keeps its id, and an empty one is not found (ESRCH, ignored).
        _kill_group(proc.pid)


def install_child_watcher() -> None:
    """From the agent's event loop, before its first command: Python 3.11's child watcher,
    but a child whose waiting thread cannot start (the sandbox at its pids limit: the fork
    took the last one) is killed and reaped at once. The stock one left it running, with
    no timeout, never reaped, while the exec answered "at the limit, try again": a retry
    could run the command twice. Python 3.12 and later watch children with a pidfd, no
    thread: nothing to install there."""
    if sys.version_info >= (3, 12):
        return

    class ReapingWatcher(asyncio.ThreadedChildWatcher):
        def add_child_handler(  # type: ignore[override]  # (typeshed's TypeVarTuple)
            self, pid: int, callback: Callable[..., object], *args: Any,
        ) -> None:
            try:
                super().add_child_handler(pid, callback, *args)
            except RuntimeError:
                _kill_group(pid)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                raise

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_child_watcher(ReapingWatcher())
