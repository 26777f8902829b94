"""One docker-engine session as the session layer sees it (engines/base.py's Sandbox).

Its container is ``deskbox-<server tag>-<session id>``, labelled with both, so that the next
server finds it again (adopt) or removes it (orphans). Its socket directory,
``<state_dir>/docker/<session id>/``, is the one host path the container mounts.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..own_desktop import OwnDesktopSandbox
from .spec import ContainerLimits

__all__ = ["DockerSandbox", "server_tag"]



def server_tag(state_dir: Path) -> str:
    """One server's containers (its state directory's), among others on the same daemon."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]


class DockerSandbox(OwnDesktopSandbox):
    def __init__(self, state_dir: Path, max_execs: int, session_id: str) -> None:
        super().__init__(max_execs, session_id, "a container")
        self.tag = server_tag(state_dir)
        self.name = f"deskbox-{self.tag}-{session_id}"
        self.socket_dir = state_dir.resolve() / "docker" / session_id
        self.container_id: str | None = None
        # Set by the engine's watcher (engine.py) when the container stops on its own.
        self.ended: str | None = None
        # Set by the watcher while the container is paused and the server did not pause
        # it (docker pause, podman pause); cleared once it runs again.
        self.held_outside: str | None = None
        self.frozen = False  # paused by the engine's freeze()
        # The engine's pauses and unpauses so far: a listing made across one of them says
        # nothing of the container's state after it.
        self.pause_changes = 0
        self.timings: dict[str, float] = {}
        # Made without its CPU quota (the start-up boost): the engine's started() applies it.
        self.pending_quota: ContainerLimits | None = None

    @property
    def label(self) -> str:
        return f"the container {self.name}"

    def failure(self) -> str | None:
        return self.ended

    def held(self) -> str | None:
        return self.held_outside
