"""One kubernetes-engine session as the session layer sees it (engines/base.py's Sandbox):
its Pod (``deskbox-<session id>``, spec.py), the pod IP its agent listens on, and the token
that agent asks for."""

from __future__ import annotations

from ..own_desktop import OwnDesktopSandbox
from .spec import pod_name

__all__ = ["PodSandbox"]


class PodSandbox(OwnDesktopSandbox):
    def __init__(self, max_execs: int, session_id: str, token: str = "") -> None:
        super().__init__(max_execs, session_id, "a pod")
        self.name = pod_name(session_id)
        self.token = token
        self.pod_ip = ""
        # Set by the engine's watch (engine.py) when the pod ends on its own.
        self.ended: str | None = None
        # What its start waits for, for a timeout's message: " (Unschedulable: …)".
        self.waiting_for = ""
        self.timings: dict[str, float] = {}

    @property
    def label(self) -> str:
        return f"the pod {self.name}"

    def failure(self) -> str | None:
        return self.ended
