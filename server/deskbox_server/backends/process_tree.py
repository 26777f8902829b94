"""Host processes we spawn and wait for on the event loop, and killing a sandboxed tree.

:class:`Child` is a process started with ``posix_spawn`` (any of our descriptors placed at
any number, its own session) and awaited through a pidfd: no thread, no child watcher,
and no orphan collector (``driver.processes``) mistakes it for an orphan.

:func:`kill_process_tree` ends a command that runs in a sandbox: every process of the
sandbox's pid namespace in the command's session or below it, until none is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Mapping, Sequence

__all__ = ["Child", "kill_process_tree"]

_KILL_ROUNDS = 50
_HIGH_FD = 10  # descriptors are moved above this before they are placed


class Child:
    """``argv`` spawned with ``fds`` (child fd number → our fd) and nothing else open."""

    def __init__(self, argv: Sequence[str], fds: Mapping[int, int]) -> None:
        moved: list[int] = []
        try:
            # dup2(fd, fd) would keep close-on-exec set: move ours out of the way first.
            for fd in fds.values():
                moved.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD))
            actions = [
                (os.POSIX_SPAWN_DUP2, fd, target)
                for target, fd in zip(fds.keys(), moved, strict=True)
            ]
            self.pid = os.posix_spawnp(
                argv[0], list(argv), dict(os.environ), file_actions=actions, setsid=True
            )
        finally:
            for fd in moved:
                os.close(fd)
        self.returncode: int | None = None
        self._pidfd: int | None = os.pidfd_open(self.pid)
        self._exit: asyncio.Future[int] | None = None

    def _watch(self) -> asyncio.Future[int]:
        if self._exit is None:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[int] = loop.create_future()
            pidfd = self._pidfd
            assert pidfd is not None

            def collect() -> None:
                loop.remove_reader(pidfd)
                _, status = os.waitpid(self.pid, 0)  # it has exited: no wait
                self.returncode = os.waitstatus_to_exitcode(status)
                os.close(pidfd)
                self._pidfd = None
                exited.set_result(self.returncode)

            loop.add_reader(pidfd, collect)
            self._exit = exited
        return self._exit

    async def wait(self) -> int:
        return await asyncio.shield(self._watch())

    def kill(self) -> None:
        """SIGKILL its whole session (it leads one)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


def _stat_fields(pid: str) -> tuple[int, int] | None:
    """(ppid, session id) of a live process, None for gone processes and zombies."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[1]), int(fields[4])


def _tree(leader: int, pidns: str) -> list[int]:
    """Live processes of ``pidns`` in ``leader``'s session or below ``leader``."""
    parents: dict[int, int] = {}
    members: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is None:
            continue
        pid = int(name)
        parents[pid] = fields[0]
        if fields[1] == leader or pid == leader:
            members.add(pid)
    for pid in parents:
        seen: set[int] = set()
        ancestor = parents.get(pid, 0)
        while ancestor > 1 and ancestor not in seen:
            if ancestor == leader:
                members.add(pid)
                break
            seen.add(ancestor)
            ancestor = parents.get(ancestor, 0)
    inside: list[int] = []
    for pid in members:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") == pidns:
                inside.append(pid)
    return inside


def kill_process_tree(leader: int, pidns: str) -> int:
    """SIGKILL ``leader``'s tree inside the pid namespace ``pidns`` until it is empty.

    ``leader`` is a host pid that leads its session. Only processes of ``pidns`` (the
    sandbox's) are ever signalled. Returns how many signals were sent.
    """
    sent = 0
    for _ in range(_KILL_ROUNDS):
        pids = _tree(leader, pidns)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                sent += 1
        time.sleep(0.005)
    return sent
