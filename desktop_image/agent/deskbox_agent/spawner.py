"""Where the session's commands are forked: a thread of the agent's own.

A forked child takes its scheduling policy from the thread that forked it. Inside a sandbox
the init asks (``DESKBOX_IDLE_COMMANDS``) for the session's workload at ``SCHED_IDLE``
beside its browser: the agent, the X server and the window manager then take the CPU from
a busy command at once, and the browser and the commands share the rest (deskbox-session
says why). The agent's own threads keep the normal policy, so only this thread takes
``SCHED_IDLE``, once; everything it forks inherits it, before its first instruction (no
window in which a command could run, or fork, at the normal policy). Elsewhere (the local
engine, where it would weigh against every process of the host) the thread is an
ordinary one.

The fork runs off the event loop in either case (``subprocess.Popen`` blocks while the
child starts), one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

__all__ = ["IDLE_COMMANDS_ENV", "Spawner"]

IDLE_COMMANDS_ENV = "DESKBOX_IDLE_COMMANDS"

log = logging.getLogger(__name__)


class Spawner:
    def __init__(self, idle: bool) -> None:
        self.idle = idle
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deskbox-spawn",
                                        initializer=self._enter)

    def _enter(self) -> None:
        if not self.idle:
            return
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        except OSError as error:
            log.warning("commands run at the normal policy: SCHED_IDLE refused (%s)", error)

    async def start(self, argv: list[str], env: dict[str, str], cwd: str | None
                    ) -> subprocess.Popen[bytes]:
        """The command started in a session of its own, stdin /dev/null, stdout and stderr
        pipes. OSError when it cannot be executed. A caller cancelled while the fork is on
        its way does not leave the command running: it is killed once it exists."""
        loop = asyncio.get_running_loop()
        forking = loop.run_in_executor(self._pool, _popen, argv, env, cwd)
        try:
            return await asyncio.shield(forking)
        except asyncio.CancelledError:
            forking.add_done_callback(functools.partial(self._abandon, loop))
            raise

    def _abandon(self, loop: asyncio.AbstractEventLoop,
                 forking: asyncio.Future[subprocess.Popen[bytes]]) -> None:
        if forking.cancelled() or forking.exception() is not None:
            return
        proc = forking.result()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        # Reaped off the loop: SIGKILL ends it at once (no zombie left behind).
        loop.run_in_executor(self._pool, proc.wait)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _popen(argv: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
