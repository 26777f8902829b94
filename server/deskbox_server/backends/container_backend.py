"""The container backend: sessions in runc sandboxes (container.py), behind the Backend
interface of base.py, with the driver connected to each sandbox's X server.

Pause, hibernate, snapshot and fork are here too; what they do to a sandbox is in
freezer.py, checkpoint.py and sandbox_snapshot.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterable, Callable, Collection
from pathlib import Path
from typing import ClassVar

from ..agent.client import AgentClient
from ..driver.desktop import Desktop
from ..driver.processes import become_subreaper
from ..driver.worker import CLOSE_TIMEOUT_S, DEFAULT_CALL_TIMEOUT_S, DesktopWorker
from ..errors import BrowserUnavailable, DesktopFailed, InvalidRequest
from ..sandbox_io import ExecCommand, ExecResult, FileDownload
from . import freezer
from .agent_link import connect_agent
from .base import Backend, DesktopHandle, SessionSpec, SnapshotInfo
from .checkpoint import Criu, hibernate_sandbox, restore_sandbox
from .container import ContainerOptions, ContainerSandbox, remove_orphans
from .devtools import DEVTOOLS_PORT, DevtoolsSocket, connect_in_netns
from .exec_slots import ExecSlots
from .network import Egress, check_allow, resolve_egress
from .oci import Limits
from .sandbox_agent import AgentSandboxIO, sandbox_environment
from .sandbox_exec import SandboxExec
from .sandbox_snapshot import restore_copy, take_snapshot
from .seccomp import seccomp_profile
from .vnc_server import SandboxVnc, VncServer

__all__ = ["ContainerBackend", "ContainerHandle"]

log = logging.getLogger("deskbox.backends")

_AGENT_FAILURE_GRACE_S = 3.0  # see ContainerHandle.failure


class ContainerHandle(DesktopHandle):
    def __init__(
        self, worker: DesktopWorker, sandbox: ContainerSandbox, desktop: Desktop | None,
        agent: AgentClient | None = None,
    ) -> None:
        self.worker = worker
        self.sandbox = sandbox
        self.exec_slots = ExecSlots(sandbox.options.max_execs, sandbox.container_id)
        # None while the sandbox is checkpointed (hibernated, also across a server restart).
        self._desktop = desktop
        # The host's one connection to the sandbox's agent (agent_link.py); None while
        # checkpointed, and while a checkpoint is taken.
        self.agent = agent
        self._io: AgentSandboxIO | None = None
        self._agent_failed_at: float | None = None

    @property
    def desktop(self) -> Desktop:
        if self._desktop is None:
            raise DesktopFailed(f"the sandbox {self.sandbox.container_id} is not running")
        return self._desktop

    def failure(self) -> str | None:
        failure = self.sandbox.failure()
        agent = self.agent
        if failure is not None or agent is None or agent.failed_reason is None:
            return failure
        # The agent's stream also ends when the whole sandbox does (its X server exited, it
        # was killed): its init ends its children first and exits up to 2 s later. That
        # exit is the better reason, so the agent's own waits a moment for it.
        now = time.monotonic()
        if self._agent_failed_at is None:
            self._agent_failed_at = now
        if now - self._agent_failed_at < _AGENT_FAILURE_GRACE_S:
            return None
        return f"the sandbox's agent failed: {agent.failed_reason}"

    # exec and files: inside the sandbox, through its agent (sandbox_agent.py)

    def _agent_io(self) -> AgentSandboxIO:
        agent = self.agent
        if agent is None or self.sandbox.init_pid is None:
            raise DesktopFailed(f"the sandbox {self.sandbox.container_id} is not running")
        if self._io is None or self._io.client is not agent:
            env, cwd = sandbox_environment(
                self.sandbox.bundle, f":{self.sandbox.inner_display}"
            )
            self._io = AgentSandboxIO(agent, env, cwd, self.exec_slots)
        return self._io

    async def exec(self, command: ExecCommand) -> ExecResult:
        return await self._agent_io().run(command)

    async def read_file(self, path: str, limit: int) -> FileDownload:
        return await self._agent_io().read_file(path, limit)

    async def write_file(self, path: str, chunks: AsyncIterable[bytes], limit: int) -> int:
        return await self._agent_io().write_file(path, chunks, limit)

    # x11vnc still starts through runc exec (sandbox_exec.py, vnc_server.py): the host holds
    # its process and reads its log; the live view over the agent's channels is other work.

    def _runner(self, counted: bool = True) -> SandboxExec:
        """``counted``: its runc execs take the session's exec slots (all but x11vnc's)."""
        sandbox = self.sandbox
        if sandbox.init_pid is None:
            raise DesktopFailed(f"the sandbox {sandbox.container_id} is not running")
        return SandboxExec(
            sandbox.options.runc, sandbox.container_id, sandbox.bundle,
            f":{sandbox.inner_display}", sandbox.init_pid,
            self.exec_slots if counted else None,
        )

    async def start_vnc(self) -> VncServer:
        """x11vnc inside the sandbox, on a unix socket in its socket directory."""
        # Not counted: the hub runs one per session, and a viewer is never refused
        # because the session's commands hold every slot.
        return await SandboxVnc.start(
            self._runner(counted=False), self.sandbox.socket_dir, self.sandbox.display_dir
        )

    async def open_devtools(self) -> DevtoolsSocket:
        """Into the sandbox's own network namespace: the port is reachable nowhere else."""
        sandbox = self.sandbox
        pid = sandbox.init_pid
        if pid is None or sandbox.failure() is not None:
            raise BrowserUnavailable(f"the sandbox {sandbox.container_id} is not running")
        return await connect_in_netns(
            f"/proc/{pid}/ns/net", DEVTOOLS_PORT, alive=lambda: sandbox.failure() is None
        )


class ContainerBackend(Backend):
    """Sessions in runc sandboxes made from the image ``options.rootfs``.

    ``shared_memory`` selects MIT-SHM capture (a sealed memfd shared with the sandbox's X
    server, see ``driver/shm.py``; ~4x faster) or plain GetImage.
    """

    name: ClassVar[str] = "container"

    def __init__(
        self,
        options: ContainerOptions,
        shared_memory: bool = True,
        image: Callable[[threading.Event], Path] | None = None,
        criu: Criu | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        """``image``, if given, finds or builds the session image (blocking; it stops when
        its event is set): :meth:`prepare` runs it and uses its result as ``options.rootfs``.
        ``call_timeout_s``: the base deadline of every driver call (driver/worker.py).
        """
        self.options = options
        self.call_timeout_s = call_timeout_s
        self.shared_memory = shared_memory
        self._image = image
        self._criu = criu or Criu()

    async def prepare(self) -> None:
        # runc exits once a sandbox runs: its init must reparent to us, to be reaped.
        become_subreaper()
        # Refuse to serve at all without the syscall allowlist (Internal, naming its
        # package); every sandbox start reads it again, so a later loss fails that session.
        await asyncio.to_thread(seccomp_profile, self.options.seccomp_source)
        if self._image is None:
            return
        cancel = threading.Event()
        try:
            rootfs = await asyncio.to_thread(self._image, cancel)
        except asyncio.CancelledError:
            cancel.set()
            raise
        self.options = dataclasses.replace(self.options, rootfs=rootfs)

    async def adopt(self, spec: SessionSpec) -> DesktopHandle:
        sandbox = await asyncio.to_thread(ContainerSandbox.adopt, self.options, spec.id)
        return await self._connect(spec.id, sandbox)

    async def adopt_hibernated(self, spec: SessionSpec) -> DesktopHandle:
        sandbox = await asyncio.to_thread(
            ContainerSandbox.adopt_checkpointed, self.options, spec.id
        )
        return ContainerHandle(DesktopWorker(spec.id, self.call_timeout_s), sandbox, None)

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        return await asyncio.to_thread(remove_orphans, self.options, keep)

    def check(self, spec: SessionSpec) -> None:
        if spec.record:
            raise InvalidRequest("record is not supported yet by the container backend")
        if spec.network is not None:
            check_allow(spec.network.egress, spec.network.allow)
            if spec.from_snapshot is not None and spec.network.egress != "none":
                raise InvalidRequest(
                    "a session made from a snapshot has the snapshot's network (egress "
                    "\"none\"); leave network out"
                )

    async def create(self, spec: SessionSpec, timeout_s: float) -> DesktopHandle:
        self.check(spec)
        limits = Limits()
        if spec.resources is not None:
            limits = Limits(spec.resources.cpus, spec.resources.memory_mb, spec.resources.pids)
        started = time.monotonic()
        if spec.from_snapshot is not None:
            sandbox = await asyncio.to_thread(
                restore_copy, self.options, spec.id, spec.from_snapshot, self._criu, limits,
                timeout_s,
            )
        else:
            egress = Egress()
            if spec.network is not None and spec.network.egress != "none":
                # Host names of an allowlist are resolved here, on the host, once.
                egress = await asyncio.to_thread(
                    resolve_egress, spec.network.egress, spec.network.allow
                )
            sandbox = await asyncio.to_thread(
                ContainerSandbox.start, self.options, spec.id, spec.desktop, limits, True,
                timeout_s, egress, not spec.background,
            )
        handle = await self._connect(spec.id, sandbox)
        sandbox.timings["desktop"] = time.monotonic() - started
        return handle

    async def _connect(self, session_id: str, sandbox: ContainerSandbox) -> ContainerHandle:
        worker = DesktopWorker(session_id, self.call_timeout_s)
        try:
            desktop = await self._open_desktop(worker, sandbox)
            agent = await connect_agent(sandbox)
        except BaseException:
            await asyncio.to_thread(self._discard, worker, sandbox)
            raise
        return ContainerHandle(worker, sandbox, desktop, agent)

    @staticmethod
    def _discard(worker: DesktopWorker, sandbox: ContainerSandbox) -> None:
        worker.shutdown()  # a call stuck on the sandbox's X server returns once it is dead
        sandbox.destroy()

    async def freeze(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(freezer.freeze, handle.sandbox.container_id)

    async def thaw(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(freezer.thaw, handle.sandbox.container_id)

    # The driver's X connections and the agent's stream lead out of the sandbox, which CRIU
    # cannot dump: they are closed for a checkpoint and made again once the sandbox runs
    # (or runs on). Every copy of a fork connects its own agent stream (create).

    async def hibernate(self, handle: DesktopHandle) -> None:
        """Checkpoint the sandbox into its session directory; its processes end."""
        assert isinstance(handle, ContainerHandle)
        sandbox = handle.sandbox
        await self._disconnect(handle)
        try:
            await asyncio.to_thread(sandbox.pin_inner_display)
            stats = await asyncio.to_thread(hibernate_sandbox, sandbox, self._criu)
        except BaseException:
            await self._reconnect(handle)
            raise
        await asyncio.to_thread(sandbox.release_init)
        sandbox.timings["hibernate"] = stats.seconds

    async def restore(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        seconds = await asyncio.to_thread(restore_sandbox, handle.sandbox, self._criu)
        handle.sandbox.timings["restore"] = seconds
        await self._reconnect(handle)

    async def snapshot(
        self, handle: DesktopHandle, directory: Path, packed: bool = True
    ) -> SnapshotInfo:
        assert isinstance(handle, ContainerHandle)
        await self._disconnect(handle)
        try:
            stats = await asyncio.to_thread(
                take_snapshot, handle.sandbox, self._criu, directory, packed
            )
        finally:
            await self._reconnect(handle)
        return SnapshotInfo(stats.seconds, stats.raw_bytes, stats.compressed_bytes)

    async def _disconnect(self, handle: ContainerHandle) -> None:
        """Close the agent's stream and the driver's connections on the worker (within its
        deadline: DesktopFailed if the X server does not answer, and then the session
        fails)."""
        await self._close_agent(handle)
        desktop, handle._desktop = handle._desktop, None
        if desktop is not None:
            await handle.worker.call(desktop.close)

    async def _reconnect(self, handle: ContainerHandle) -> None:
        handle._desktop = await self._open_desktop(handle.worker, handle.sandbox)
        handle.agent = await connect_agent(handle.sandbox)
        handle._agent_failed_at = None

    async def _open_desktop(self, worker: DesktopWorker, sandbox: ContainerSandbox) -> Desktop:
        """The driver's connection to the sandbox's X server, made on ``worker``'s thread."""
        return await worker.call(
            Desktop, sandbox.display_name, sandbox.failure, self.shared_memory
        )

    async def release(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        if handle.sandbox.init_pid is not None:  # not checkpointed after all
            await self.destroy(handle)
            return
        handle.worker.shutdown()
        await self._close_agent(handle)
        await asyncio.to_thread(handle.sandbox.release_host_side)

    @staticmethod
    async def _close_agent(handle: ContainerHandle) -> None:
        agent, handle.agent = handle.agent, None
        if agent is not None:
            await agent.close()

    async def destroy(self, handle: DesktopHandle) -> None:
        """Kill the sandbox first, then close the driver, then remove the rest.

        Never waits on the X server: a stopped, frozen or grabbed one answers nothing, and a
        driver call stuck on it returns only once it is dead. Closing the driver waits at
        most CLOSE_TIMEOUT_S for the worker; the worker's thread is a daemon.
        """
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(handle.sandbox.kill)
        await self._close_agent(handle)
        desktop, handle._desktop = handle._desktop, None
        if desktop is None:
            handle.worker.shutdown()
        elif not await handle.worker.finish(desktop.close, CLOSE_TIMEOUT_S):
            log.warning("session %s: the driver did not close in time", handle.worker.name)
        await asyncio.to_thread(handle.sandbox.destroy)
