"""The docker engine's watcher against a listing that takes a while: a container created while
the daemon lists (a session starting on a busy host) is not in that listing, and is not
taken for removed. Once in 1,300 tests a session failed to start so ("was removed by
someone else"). The daemon here is our own client's class with its listing held at a seam;
everything else is the engine's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from deskbox_server.engines.docker.daemon import Daemon
from deskbox_server.engines.docker.engine import DockerEngine, DockerOptions
from deskbox_server.engines.docker.sandbox import DockerSandbox


class _HeldListing(Daemon):
    """Lists what ``containers`` holds when the listing was asked for, answering only once
    ``answer`` is set (as a daemon that read its table, then took its time)."""

    def __init__(self) -> None:
        super().__init__("unix:///nonexistent")
        self.containers: dict[str, str] = {}  # id → state
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def list_labelled(self, label: str) -> list[dict[str, Any]]:
        listed = [{"Id": cid, "State": state} for cid, state in self.containers.items()]
        self.asked.set()
        await self.answer.wait()
        return listed


def _sandbox(engine: DockerEngine, tmp_path: Path, session_id: str, container_id: str
             ) -> DockerSandbox:
    sandbox = DockerSandbox(tmp_path, 1, session_id)
    sandbox.container_id = container_id
    engine._sandboxes[session_id] = sandbox  # as create() does once the daemon made it
    return sandbox


async def test_a_container_created_during_a_listing_is_not_taken_for_removed(
    tmp_path: Path,
) -> None:
    engine = DockerEngine(DockerOptions(url="unix:///nonexistent", state_dir=tmp_path))
    daemon = engine.daemon = _HeldListing()
    daemon.containers["c-old"] = "running"
    old = _sandbox(engine, tmp_path, "ses_old", "c-old")

    watching = asyncio.create_task(engine.look_at_containers())
    await daemon.asked.wait()
    daemon.containers["c-new"] = "running"
    new = _sandbox(engine, tmp_path, "ses_new", "c-new")
    daemon.answer.set()
    await watching
    assert (old.ended, new.ended) == (None, None)

    # The next round judges it, and one that is gone is still seen as removed.
    del daemon.containers["c-old"]
    await engine.look_at_containers()
    assert (old.ended, new.ended) == ("was removed by someone else", None)
