"""The ``local`` engine: an unisolated desktop of host processes (sandbox.py).

For development and tests on a machine you trust: the desktop shares the host's network,
users and files, so the engine declares none of the capabilities that promise isolation
or reach into a sandbox (engines/base.py), and refuses the requests that need them. Its
desktop is driven through its agent like a sandbox's; the host itself speaks no X11 to it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Collection
from pathlib import Path
from typing import ClassVar

from ...errors import DesktopFailed
from ..base import AgentStream, Engine, SessionSpec
from ..in_thread import made_in_thread
from .sandbox import LocalSandbox, remove_owned

__all__ = ["LocalEngine"]

log = logging.getLogger("deskbox.local")


class LocalEngine(Engine[LocalSandbox]):
    name: ClassVar[str] = "local"
    hint: ClassVar[str] = (
        "its desktops are processes of the host, with no sandbox (Deskbox never runs "
        "commands or touches files on the host for a session); use the container engine"
    )

    def __init__(self, state_dir: Path | None = None) -> None:
        """``state_dir``: the server's; its desktops are marked with it, so that the next
        server on it ends those a server killed outright left running (remove_orphans)."""
        self._owner = (hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]
                       if state_dir is not None else None)
        self._held: set[LocalSandbox] = set()

    async def create(self, spec: SessionSpec, timeout_s: float) -> LocalSandbox:
        sandbox = await made_in_thread(
            lambda: LocalSandbox(spec.desktop, timeout_s, owner=self._owner), LocalSandbox.stop)
        self._held.add(sandbox)
        return sandbox

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        # Its desktops are not adopted (nothing to keep) and have no session ids of their
        # own: the processes are counted, not named.
        if self._owner is not None:
            owner, held = self._owner, list(self._held)
            if killed := await asyncio.to_thread(remove_owned, owner, held):
                log.info("ended %d processes of local desktops a previous server left", killed)
        return []

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
        self._held.discard(sandbox)
        await asyncio.to_thread(sandbox.stop)
