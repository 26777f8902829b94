"""The container backend: sessions in runc sandboxes (container.py), behind the Backend
interface of base.py, each driven through its own agent over one stream (agent_link.py).

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
from ..errors import InvalidRequest
from ..sandbox_io import ExecCommand, ExecResult, FileDownload
from . import freezer
from .agent_handle import DEFAULT_CALL_TIMEOUT_S, AgentHandle
from .agent_link import connect_agent
from .agent_vnc import SOCKET_DIR
from .base import Backend, DesktopHandle, SessionSpec, SnapshotInfo
from .checkpoint import Criu, hibernate_sandbox, restore_sandbox
from .container import ContainerOptions, ContainerSandbox, remove_orphans
from .exec_slots import ExecSlots
from .network import Egress, check_allow, resolve_egress
from .oci import Limits
from .processes import become_subreaper
from .sandbox_agent import AgentSandboxIO, sandbox_environment
from .sandbox_snapshot import restore_copy, take_snapshot
from .seccomp import seccomp_profile

__all__ = ["ContainerBackend", "ContainerHandle"]

log = logging.getLogger("deskbox.backends")



class ContainerHandle(AgentHandle):
    def __init__(
        self, sandbox: ContainerSandbox, agent: AgentClient | None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self.sandbox = sandbox
        self.exec_slots = ExecSlots(sandbox.options.max_execs, sandbox.container_id)
        self._io: AgentSandboxIO | None = None
        # The host's one connection to the sandbox's agent (agent_link.py); None while
        # checkpointed (hibernated, also across a server restart) and while a checkpoint
        # is taken.
        super().__init__(agent, call_timeout_s)

    @property
    def label(self) -> str:
        return f"the sandbox {self.sandbox.container_id}"

    def processes_failure(self) -> str | None:
        return self.sandbox.failure()

    @property
    def running(self) -> bool:
        return self.sandbox.init_pid is not None

    @property
    def vnc_display(self) -> str:
        return f":{self.sandbox.inner_display}"

    @property
    def vnc_socket_dir(self) -> str:
        return SOCKET_DIR

    # exec and files: inside the sandbox, through its agent (sandbox_agent.py)

    def _agent_io(self) -> AgentSandboxIO:
        agent = self.live_agent()
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


class ContainerBackend(Backend):
    """Sessions in runc sandboxes made from the image ``options.rootfs``.

    The host never connects to a sandbox's X server: the agent inside drives it.
    """

    name: ClassVar[str] = "container"

    def __init__(
        self,
        options: ContainerOptions,
        image: Callable[[threading.Event], Path] | None = None,
        criu: Criu | None = None,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        """``image``, if given, finds or builds the session image (blocking; it stops when
        its event is set): :meth:`prepare` runs it and uses its result as ``options.rootfs``.
        ``call_timeout_s``: the base deadline of every desktop call (settle.py adds what a
        batch may take beyond it).
        """
        self.options = options
        self.call_timeout_s = call_timeout_s
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
        return await self._connect(sandbox)

    async def adopt_hibernated(self, spec: SessionSpec) -> DesktopHandle:
        sandbox = await asyncio.to_thread(
            ContainerSandbox.adopt_checkpointed, self.options, spec.id
        )
        return ContainerHandle(sandbox, None, self.call_timeout_s)

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
        remaining = max(0.1, timeout_s - (time.monotonic() - started))
        handle = await self._connect(sandbox, ready_within_s=(
            remaining if spec.from_snapshot is None else None))
        sandbox.timings["desktop"] = time.monotonic() - started
        return handle

    async def _connect(
        self, sandbox: ContainerSandbox, ready_within_s: float | None = None
    ) -> ContainerHandle:
        """A handle on the sandbox's agent; with ``ready_within_s``, once the agent says the
        window manager runs and the browser has painted its window (a fresh start)."""
        handle = ContainerHandle(sandbox, None, self.call_timeout_s)
        try:
            handle.attach(await connect_agent(sandbox))
            if ready_within_s is not None:
                started = time.monotonic()
                stages = await handle.desktop.ready(True, ready_within_s)
                sandbox.timings.update({f"ready_{k}": v for k, v in stages.items()})
                sandbox.timings["ready"] = time.monotonic() - started
                await asyncio.to_thread(sandbox.apply_limits)
        except BaseException:
            await handle.let_go()
            await asyncio.to_thread(sandbox.destroy)
            raise
        return handle

    async def freeze(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(freezer.freeze, handle.sandbox.container_id)

    async def thaw(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(freezer.thaw, handle.sandbox.container_id)

    # The agent's stream leads out of the sandbox, which CRIU cannot dump: it is closed for
    # a checkpoint and made again once the sandbox runs (or runs on). Every copy of a fork
    # connects its own agent stream (create).

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
        await handle.let_go()

    async def _reconnect(self, handle: ContainerHandle) -> None:
        handle.attach(await connect_agent(handle.sandbox))

    async def release(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, ContainerHandle)
        if handle.sandbox.init_pid is not None:  # not checkpointed after all
            await self.destroy(handle)
            return
        await handle.let_go()
        await asyncio.to_thread(handle.sandbox.release_host_side)

    async def destroy(self, handle: DesktopHandle) -> None:
        """Kill the sandbox first, then close the agent's stream, then remove the rest.

        Never waits on the sandbox: a stopped or frozen agent answers nothing, and a call
        waiting on it ends when its stream does.
        """
        assert isinstance(handle, ContainerHandle)
        await asyncio.to_thread(handle.sandbox.kill)
        await handle.let_go()
        await asyncio.to_thread(handle.sandbox.destroy)
