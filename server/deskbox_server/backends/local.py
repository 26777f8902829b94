"""The ``local`` backend: an unisolated desktop of host processes (local_desktop.py).

For development and tests on a machine you trust: the desktop shares the host's network,
users and files, so it refuses the options that promise isolation. It is driven through its
agent like a sandbox's (agent_handle.py); the host itself speaks no X11 to it.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from ..agent.client import AgentClient
from ..errors import InvalidRequest
from .agent_handle import DEFAULT_CALL_TIMEOUT_S, AgentHandle
from .base import Backend, DesktopHandle, SessionSpec
from .local_desktop import LocalDesktop

__all__ = ["LocalBackend", "LocalHandle"]


class LocalHandle(AgentHandle):
    no_sandbox: ClassVar[str] = (
        "the local backend has no sandbox, and Deskbox never runs commands or touches "
        "files on the host for a session; use the container backend"
    )

    def __init__(
        self, local: LocalDesktop, agent: AgentClient, port: int,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self.local = local
        self.port = port
        super().__init__(agent, call_timeout_s)

    @property
    def label(self) -> str:
        return f"the desktop {self.local.display_name}"

    def processes_failure(self) -> str | None:
        return self.local.processes.failure()

    @property
    def vnc_display(self) -> str:
        return self.local.display_name

    @property
    def vnc_socket_dir(self) -> str:
        return str(self.local.workdir)

    @property
    def devtools_port(self) -> int:
        return self.port

    @property
    def devtools_url(self) -> str:
        """The browser's DevTools endpoint on the host's loopback (tests read pages with it)."""
        return f"http://127.0.0.1:{self.port}"


def _stop_started(starting: asyncio.Future[LocalDesktop]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, starting.result().stop)


class LocalBackend(Backend):
    name: ClassVar[str] = "local"

    def __init__(self, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S) -> None:
        self.call_timeout_s = call_timeout_s

    def check(self, spec: SessionSpec) -> None:
        unsupported = "is not supported yet by the local backend"
        if spec.from_snapshot is not None:
            raise InvalidRequest(f"from_snapshot {unsupported} (no checkpoints)")
        if spec.record:
            raise InvalidRequest(f"record {unsupported}")
        if spec.resources is not None:
            raise InvalidRequest(f"resources {unsupported} (no cgroup limits)")
        if spec.network is not None and spec.network.egress != "all":
            raise InvalidRequest(
                f"network egress {spec.network.egress!r} {unsupported}: its desktops share "
                "the host's network; omit network or ask for egress 'all'"
            )

    async def create(self, spec: SessionSpec, timeout_s: float) -> DesktopHandle:
        self.check(spec)
        started = time.monotonic()
        starting = asyncio.ensure_future(asyncio.to_thread(LocalDesktop, spec.desktop, timeout_s))
        try:
            local = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_stop_started)  # its thread runs on: stop what it made
            raise
        agent: AgentClient | None = None
        try:
            agent = await AgentClient.connect_unix(str(local.agent_socket))
            handle = LocalHandle(local, agent, 0, self.call_timeout_s)
            remaining = max(0.1, timeout_s - (time.monotonic() - started))
            stages = await handle.desktop.ready(True, remaining)
            local.timings.update({f"ready_{k}": v for k, v in stages.items()})
            handle.port = await asyncio.to_thread(local.wait_devtools_port, remaining)
        except BaseException:
            if agent is not None:
                await agent.close()
            await asyncio.to_thread(local.stop)
            raise
        return handle

    async def destroy(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, LocalHandle)
        # Its processes first: a call waiting on the agent ends when its stream does.
        await asyncio.to_thread(handle.local.processes.stop)
        await handle.let_go()
        await asyncio.to_thread(handle.local.stop)
