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
from ..in_thread import made_in_thread
from .sandbox import LocalSandbox

__all__ = ["LocalEngine"]


class LocalEngine(Engine[LocalSandbox]):
    name: ClassVar[str] = "local"
    hint: ClassVar[str] = (
        "its desktops are processes of the host, with no sandbox (Deskbox never runs "
        "commands or touches files on the host for a session); use the container engine"
    )

    async def create(self, spec: SessionSpec, timeout_s: float) -> LocalSandbox:
        return await made_in_thread(lambda: LocalSandbox(spec.desktop, timeout_s),
                                    LocalSandbox.stop)

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
