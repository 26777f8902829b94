"""The ``local`` engine: an unisolated desktop of host processes (sandbox.py).

For development and tests on a machine you trust: the desktop shares the host's network,
users and files, so the engine declares none of the capabilities that promise isolation
or reach into a sandbox (engines/base.py), and refuses the requests that need them. Its
desktop is driven through its agent like a sandbox's; the host itself speaks no X11 to it.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from ...errors import DesktopFailed
from ..base import AgentStream, Engine, SessionSpec
from .sandbox import LocalSandbox

__all__ = ["LocalEngine"]


def _stop_started(starting: asyncio.Future[LocalSandbox]) -> None:
    if not starting.cancelled() and starting.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, starting.result().stop)


class LocalEngine(Engine[LocalSandbox]):
    name: ClassVar[str] = "local"
    hint: ClassVar[str] = (
        "its desktops are processes of the host, with no sandbox (Deskbox never runs "
        "commands or touches files on the host for a session); use the container engine"
    )

    async def create(self, spec: SessionSpec, timeout_s: float) -> LocalSandbox:
        starting = asyncio.ensure_future(asyncio.to_thread(LocalSandbox, spec.desktop, timeout_s))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(_stop_started)  # its thread runs on: stop what it made
            raise

    async def started(self, sandbox: LocalSandbox, timeout_s: float) -> None:
        # The browser picks its DevTools port (the host's loopback is shared).
        sandbox.port = await asyncio.to_thread(sandbox.wait_devtools_port, timeout_s)

    async def open_stream(self, sandbox: LocalSandbox, read_limit: int) -> AgentStream:
        try:
            return await asyncio.open_unix_connection(str(sandbox.agent_socket), limit=read_limit)
        except OSError as error:
            raise DesktopFailed(f"cannot connect to the desktop's agent: {error!r}") from None

    async def kill(self, sandbox: LocalSandbox) -> None:
        # Its processes first: a call waiting on the agent ends when its stream does.
        await asyncio.to_thread(sandbox.processes.stop)

    async def destroy(self, sandbox: LocalSandbox) -> None:
        await asyncio.to_thread(sandbox.stop)
