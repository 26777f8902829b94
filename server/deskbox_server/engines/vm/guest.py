"""One running QEMU process and its QMP connection: start, pause, save, stop.

Everything here is about QEMU, not about sessions: sandbox.py and engine.py decide when.
A guest is started in a process group of its own (``start_new_session``) so that the
server's orphan reaper never takes its exit status, and so that a server that dies leaves
it running for the next one to adopt or remove.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ...errors import (
    CheckpointUnavailable,
    DesktopFailed,
    InsufficientStorage,
    SessionFailed,
    Timeout,
    says_no_room,
)
from ..untrusted_files import read_regular
from .accel import Accelerator
from .qemu import AGENT_PORT_ID, GuestImage, VmConfig, VmPaths, guest_files, qemu_argv
from .qmp import QmpClient, QmpError, QmpRefused
from .runtime_files import create_own

__all__ = [
    "VmGuest",
    "in_thread_to_the_end",
    "kill_leftover",
    "leftover_pid",
    "start_guest",
]

T = TypeVar("T")

_POLL_S = 0.02
_LOG_TAIL = 2000
# Migration streams at disk speed: QEMU's default limit (32 MiB/s) would make a 1 GiB
# guest take half a minute to hibernate.
_MIGRATION_BANDWIDTH = 8 << 30


@dataclass
class VmGuest:
    pid: int
    paths: VmPaths
    qmp: QmpClient
    process: subprocess.Popen[bytes] | None = None  # None: adopted from another server
    timings: dict[str, float] = field(default_factory=dict)

    def failure(self) -> str | None:
        """Why QEMU is gone, with the end of its log; None while it runs."""
        if self.process is not None:
            code = self.process.poll()
            if code is None:
                return None
            how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        elif _alive(self.pid):
            return None
        else:
            how = "exited"
        return f"the VM's QEMU (pid {self.pid}) {how}{_tail(self.paths)}"

    async def agent_port_event(self, opened: bool, since: int, timeout_s: float) -> None:
        """Wait for the guest's agent to open (or close) its port after ``since``."""
        await self.qmp.wait_event("VSERPORT_CHANGE", timeout_s, since,
                                  {"id": AGENT_PORT_ID, "open": opened})

    async def status(self) -> str:
        answer = await self.qmp.execute("query-status")
        return str(answer.get("status")) if isinstance(answer, dict) else "unknown"

    async def pause(self) -> None:
        await self.qmp.execute("stop")

    async def resume(self) -> None:
        await self.qmp.execute("cont")

    async def save(self, path: Path, timeout_s: float) -> int:
        """Stop the guest and write its whole state to the new file ``path`` (QEMU's
        migration stream); the guest stays stopped ("postmigrate"). Its size.
        InsufficientStorage when QEMU's writes met a full disk or a quota, and
        CheckpointUnavailable when its migration failed otherwise."""
        started = time.monotonic()
        await self.qmp.execute("stop")
        await self.qmp.execute("migrate-set-parameters",
                               {"max-bandwidth": _MIGRATION_BANDWIDTH})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            await self.qmp.send_fd("deskbox-save", fd)
        finally:
            os.close(fd)  # QEMU holds its own copy now
        await self.qmp.execute("migrate", {"uri": "fd:deskbox-save"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            answer = await self.qmp.execute("query-migrate")
            state = answer.get("status") if isinstance(answer, dict) else None
            if state == "completed":
                break
            if state in ("failed", "cancelled"):
                detail = str(answer.get("error-desc", state)) if isinstance(answer, dict) else state
                if says_no_room(detail):  # a 507, and the guest runs on
                    raise InsufficientStorage(f"no room on the server's disk for the VM's "
                                              f"state ({path.parent}): {detail}")
                raise CheckpointUnavailable(f"QEMU could not save the VM: {detail}")
            if loop.time() > deadline:
                with contextlib.suppress(DesktopFailed):
                    await self.qmp.execute("migrate_cancel")
                raise Timeout(f"saving the VM took over {timeout_s:.0f} s")
            await asyncio.sleep(0.05)
        self.timings["save"] = time.monotonic() - started
        return (await asyncio.to_thread(path.stat)).st_size

    async def wait_running(self, timeout_s: float) -> None:
        """After an incoming migration: once it is read, run the guest (it was saved
        stopped, and QEMU restores that state)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (state := await self.status()) != "running":
            if state == "paused":
                await self.qmp.execute("cont")
                continue
            if state in ("internal-error", "shutdown", "guest-panicked"):
                raise SessionFailed(f"the restored VM is in state {state}{_tail(self.paths)}")
            if loop.time() > deadline:
                raise Timeout(f"the VM did not run within {timeout_s:.0f} s of its restore "
                              f"(state {state})")
            problem = self.failure()
            if problem is not None:
                raise SessionFailed(problem)
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Kill QEMU and wait for it to exit. Nothing in the guest needs a clean shutdown:
        its disk is read-only, and what is worth keeping was saved first."""
        await self.qmp.close()
        await asyncio.to_thread(_kill_and_wait, self.pid, self.process)


def _kill_and_wait(pid: int, process: subprocess.Popen[bytes] | None) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if process is not None:
        process.wait()
        return
    deadline = time.monotonic() + 10.0
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _tail(paths: VmPaths) -> str:
    parts = []
    for log in (paths.qemu_log, paths.console):
        # Only the end: the console log is the guest's, as long as it cared to write.
        text = read_regular(log, _LOG_TAIL, tail=True).decode(errors="replace").strip()
        if text:
            parts.append(f"{log.name}: {text}")
    return ("; " + " | ".join(parts)) if parts else ""


async def start_guest(
    image: GuestImage, config: VmConfig, paths: VmPaths, accel: Accelerator,
    env: Mapping[str, str], timeout_s: float, incoming: Path | None = None,
    wrap: list[str] | None = None, net_files: Mapping[str, str] | None = None,
) -> VmGuest:
    """Start QEMU for a new guest (or one restored from the state file ``incoming``) and
    connect to its QMP socket. ``wrap``: a command line QEMU's runs under (confinement).
    The guest's agent is not ready yet: wait with :meth:`VmGuest.agent_port_event`."""
    started = time.monotonic()
    process = await in_thread_to_the_end(
        _spawn, image, config, paths, accel, env, net_files or {}, incoming, wrap or [],
        undo=lambda spawned: _kill_and_wait(spawned.pid, spawned))
    try:
        qmp = await _connect_qmp(paths, process, timeout_s)
    except BaseException:
        await asyncio.to_thread(_kill_and_wait, process.pid, process)
        raise
    guest = VmGuest(process.pid, paths, qmp, process)
    guest.timings["qemu"] = time.monotonic() - started
    return guest


async def in_thread_to_the_end(
    func: Callable[..., T], *args: object, undo: Callable[[T], object] | None = None
) -> T:
    """``func(*args)`` in a thread. Cancelled, it still waits for the thread to finish (a
    thread cannot be stopped) and ``undo``es its result before it re-raises, so that the
    cleanup that follows finds everything the thread made, and nothing runs on unowned."""
    work = asyncio.ensure_future(asyncio.to_thread(func, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            result = await work
            if undo is not None:
                await asyncio.to_thread(undo, result)
        raise


def _spawn(
    image: GuestImage, config: VmConfig, paths: VmPaths, accel: Accelerator,
    env: Mapping[str, str], net_files: Mapping[str, str], incoming: Path | None,
    wrap: list[str],
) -> subprocess.Popen[bytes]:
    for stale in (paths.qmp, paths.agent):  # a previous QEMU's (before a hibernation)
        stale.unlink(missing_ok=True)
    files = guest_files(config, env, net_files)
    for name, content in files.items():
        # For QEMU's user; the directory keeps everyone else out.
        with open(create_own(paths.fw_cfg(name), 0o644), "wb") as file:
            file.write(content)
    own: list[int] = []  # the server's files: QEMU gets its log as stdout and stderr only
    opened: list[int] = []  # what QEMU is given
    try:
        # Made before QEMU runs: what it does to their names later changes neither.
        for path in (paths.qemu_log, paths.pid):
            own.append(create_own(path))
        qemu_log, pid_file = own
        incoming_fd = None
        if incoming is not None:
            incoming_fd = os.open(incoming, os.O_RDONLY | os.O_CLOEXEC)
            opened.append(incoming_fd)
        volume_fds: list[list[int]] = []
        for volume in config.volumes:
            volume_fds.append([])
            for access in volume.access_modes:
                # Not following a link: the disk is the volume store's own file.
                volume_fds[-1].append(
                    os.open(volume.disk, access | os.O_CLOEXEC | os.O_NOFOLLOW))
                opened.append(volume_fds[-1][-1])
        process = subprocess.Popen(
            [*wrap, *qemu_argv(image, config, paths, accel, files, incoming_fd,
                               volume_fds)],
            stdin=subprocess.DEVNULL, stdout=qemu_log, stderr=qemu_log,
            pass_fds=opened, start_new_session=True,
        )
        # The leader of QEMU's process group (its jail's unshare, or QEMU): what a later
        # server adopts or kills.
        os.write(pid_file, f"{process.pid}\n".encode())
        return process
    finally:
        for fd in (*own, *opened):
            os.close(fd)


def leftover_pid(paths: VmPaths) -> int | None:
    """The pid of the QEMU (or its jail) a previous server left running in ``paths``."""
    try:
        # QEMU's user could have put anything there.
        pid = int(read_regular(paths.pid, 32, tail=True))
    except ValueError:
        return None
    # The pid may have been reused since: only a process started for this directory counts.
    return pid if _alive(pid) and str(paths.runtime) in _cmdline(pid) else None


def kill_leftover(paths: VmPaths) -> None:
    pid = leftover_pid(paths)
    if pid is not None:
        _kill_and_wait(pid, None)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def _connect_qmp(
    paths: VmPaths, process: subprocess.Popen[bytes], timeout_s: float
) -> QmpClient:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not paths.qmp.exists():
        code = process.poll()
        if code is not None:
            raise SessionFailed(f"QEMU exited with {code} at its start{_tail(paths)}")
        if loop.time() > deadline:
            raise Timeout(f"QEMU made no QMP socket within {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_S)
    while True:
        try:
            return await QmpClient.connect(paths.qmp, max(1.0, deadline - loop.time()))
        except QmpError as error:
            # QEMU binds its socket before it listens on it: a connection in between is
            # refused (seen under load), and one after it is not.
            listening_soon = (isinstance(error, QmpRefused) and process.poll() is None
                              and loop.time() <= deadline)
            if not listening_soon:
                raise SessionFailed(f"{error}{_tail(paths)}") from None
        await asyncio.sleep(_POLL_S)
