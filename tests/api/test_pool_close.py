"""A shutdown while the warm pool is making a desktop leaves none running, on an engine
whose create can be cancelled (VM, container, pod; here the local engine declared so) and
on one whose create runs in a thread (runc, local)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.in_thread import made_in_thread
from deskbox_server.engines.local.engine import LocalEngine
from deskbox_server.engines.local.sandbox import LocalSandbox
from deskbox_server.settings import Settings

from .conftest import KEY_A, running_server


def test_a_shutdown_during_a_pool_desktops_first_batch_destroys_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool's desktop had started and was getting its empty batch when the shutdown
    cancelled the refill: it was neither queued nor destroyed, and ran on (a VM in its
    own process group, a container) with the server gone."""
    made: list[LocalSandbox] = []
    create = LocalEngine.create

    async def recorded(self: LocalEngine, spec: SessionSpec, timeout_s: float) -> Any:
        sandbox = await create(self, spec, timeout_s)
        made.append(sandbox)
        return sandbox

    settling, release = threading.Event(), threading.Event()
    run = AgentDesktop.run

    async def held(self: AgentDesktop, actions: Sequence[Any], *args: Any) -> Any:
        if not actions:  # the pool's empty batch (our seam; the real call after)
            settling.set()
            await asyncio.to_thread(release.wait, 30)
        return await run(self, actions, *args)

    monkeypatch.setattr(LocalEngine, "create", recorded)
    monkeypatch.setattr(LocalEngine, "create_cancellable", True)
    monkeypatch.setattr(AgentDesktop, "run", held)
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                        default_backend="local", pool_size=1, pool_displays=["640x400"])
    stopping = threading.Thread(target=lambda: None)
    with running_server(settings):
        assert settling.wait(60), "the pool's desktop never got its empty batch"
        # The shutdown begins while the batch is held; the batch then ends.
        stopping = threading.Thread(target=lambda: (time.sleep(0.5), release.set()))
        stopping.start()
    stopping.join()
    [sandbox] = made
    assert not sandbox.workdir.exists()
    assert all(child.popen.poll() is not None for child in sandbox.processes.children)


async def test_a_sandbox_made_for_a_cancelled_create_is_stopped_once_made() -> None:
    stopped: list[str] = []

    def make() -> str:
        time.sleep(0.3)
        return "sandbox"

    creating = asyncio.ensure_future(made_in_thread(make, stopped.append))
    await asyncio.sleep(0.05)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    for _ in range(100):
        if stopped:
            break
        await asyncio.sleep(0.02)
    assert stopped == ["sandbox"]
