"""The ``runc --criu`` commands of one sandbox in flight, each with a deadline, and ended
when the sandbox is.

Why a sandbox's end must end them: CRIU ptraces every process of the sandbox while it
dumps. Killed meanwhile (a delete), those processes become zombies that only their tracer
may reap, so the sandbox's init waits for them in the kernel (``zap_pid_ns_processes``),
while CRIU waits for that init to stop: neither ever returns, ``runc delete`` fails with
"container init still running", and the checkpoint's request never answers. Killing CRIU
(and runc, its parent) lets the kernel detach and reap them all.

Each command runs in a process group of its own, so that runc and the CRIU it starts end
together, however far they got.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Sequence

from ...errors import Conflict, SessionFailed

__all__ = ["CRIU_DEADLINE_S", "CriuDeadline", "CriuRuns"]

# A desktop dumps in under a second and restores in one or two (bench/README.md); a sandbox
# with gigabytes of memory on a slow disk takes tens of seconds. Past this, CRIU is stuck.
CRIU_DEADLINE_S = 120.0


class CriuDeadline(SessionFailed):
    """CRIU did not finish in time; it was stopped, and the sandbox cannot be trusted to go
    on from a checkpoint cut short (its processes may still carry CRIU's code)."""


class CriuRuns:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._ended = False

    def run(
        self, argv: Sequence[str], what: str, deadline_s: float = CRIU_DEADLINE_S
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``argv`` (a ``runc --criu`` command) to its end; its output, captured.

        Conflict if the sandbox is ending (:meth:`end`), CriuDeadline if it took more
        than ``deadline_s`` (it is killed then, with what it started)."""
        with self._lock:
            if self._ended:
                raise Conflict(f"the sandbox is being removed: no {what} now")
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
            )
            self._running.add(process)
        try:
            try:
                stdout, stderr = process.communicate(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                self._kill(process)
                process.communicate()
                raise CriuDeadline(
                    f"CRIU did not finish the {what} within {deadline_s:g} s and was "
                    "stopped; the sandbox cannot go on from a checkpoint cut short"
                ) from None
        finally:
            with self._lock:
                self._running.discard(process)
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    def end(self) -> None:
        """Kill every command in flight, and refuse new ones: the sandbox is ending."""
        with self._lock:
            self._ended = True
            for process in self._running:
                self._kill(process)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        # Its group is runc's pid, which stays ours until communicate() reaps runc.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
