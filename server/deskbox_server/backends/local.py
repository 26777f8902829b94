"""The ``local`` backend: an unisolated desktop of host processes (LocalDesktop).

For development and tests on a machine you trust: the desktop shares the host's network,
users and files, so it refuses the options that promise isolation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import ClassVar

from ..driver.desktop import Desktop
from ..driver.local import LocalDesktop
from ..driver.worker import CLOSE_TIMEOUT_S, DEFAULT_CALL_TIMEOUT_S, DesktopWorker
from ..errors import BrowserUnavailable, InvalidRequest
from ..media import Frame
from ..schemas import actions as a
from ..schemas.results import BatchResult
from ..settle import batch_allowance_s
from .base import Backend, DesktopHandle, SessionSpec
from .devtools import DevtoolsSocket, connect_tcp
from .vnc_server import LocalVnc, VncServer

__all__ = ["LocalBackend", "LocalHandle"]

log = logging.getLogger("deskbox.backends")


class LocalHandle(DesktopHandle):
    no_sandbox: ClassVar[str] = (
        "the local backend has no sandbox, and Deskbox never runs commands or touches "
        "files on the host for a session; use the container backend"
    )

    def __init__(self, worker: DesktopWorker, local: LocalDesktop) -> None:
        self.worker = worker
        self.local = local

    @property
    def desktop(self) -> Desktop:
        assert self.local.desktop is not None
        return self.local.desktop

    async def run(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        desktop = self.desktop
        allowance = batch_allowance_s(actions, screenshot, desktop.settle_options)
        return await self.worker.call_within(allowance, desktop.run, actions, view, screenshot)

    async def grab(self) -> Frame:
        return await self.worker.call(self.desktop.grab_screen)

    async def let_go(self) -> None:
        self.worker.shutdown()

    @property
    def devtools_url(self) -> str:
        """The browser's DevTools endpoint on the host's loopback (tests read pages with it)."""
        return self.local.devtools_url

    def failure(self) -> str | None:
        return self.local.processes.failure() or self.worker.stalled

    async def start_vnc(self) -> VncServer:
        return await LocalVnc.start(self.local.display_name)

    async def open_devtools(self) -> DevtoolsSocket:
        port = self.local.devtools_port
        if port is None:
            raise BrowserUnavailable("this desktop has no browser")
        return await connect_tcp(port)


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
        worker = DesktopWorker(spec.id, self.call_timeout_s)
        built: list[LocalDesktop] = []

        def build() -> LocalDesktop:
            # The Desktop it holds belongs to the worker's thread: build it there.
            local = LocalDesktop(spec.desktop, start_timeout_s=timeout_s)
            built.append(local)
            return local

        def stop_built() -> None:
            for local in built:
                local.stop()

        def discard() -> None:
            # Queued behind build(), so it also stops a desktop whose start was cancelled.
            worker.call_sync(stop_built)
            worker.shutdown()

        try:
            local = await worker.call_within(timeout_s, build)
        except BaseException:
            await asyncio.to_thread(discard)
            raise
        return LocalHandle(worker, local)

    async def destroy(self, handle: DesktopHandle) -> None:
        assert isinstance(handle, LocalHandle)
        # Its processes first, off the worker: a call stuck on a stalled X server returns
        # once the server is dead; then the driver's connections close on the worker.
        await asyncio.to_thread(handle.local.processes.stop)
        if not await handle.worker.finish(handle.local.stop, CLOSE_TIMEOUT_S):
            log.warning("session %s: the driver did not close in time", handle.worker.name)
