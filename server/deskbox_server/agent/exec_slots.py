"""How many ``runc exec`` processes one session may have on the host at once.

Every command, file upload or download of a container session is a ``runc exec`` that
runs on the host (about 10 MB each) until the command inside ends, outside the sandbox's
cgroup. Without a cap, concurrent requests to one session start as many of them as the
client likes. A request over the cap is refused at once (429 ``capacity`` with
``Retry-After``), never queued: a queue would hold requests, and their connections, for
as long as the sandbox's commands choose to run.

The session's VNC server is not counted: the hub runs at most one per session, and a
viewer must not be refused because the session's commands are busy.
"""

from __future__ import annotations

from ..errors import Capacity

__all__ = ["RETRY_AFTER_S", "ExecSlot", "ExecSlots"]

RETRY_AFTER_S = 1  # commands are often short: ask again soon


class ExecSlot:
    """One taken slot; ``release()`` it (idempotent) once the runc exec has ended."""

    def __init__(self, slots: ExecSlots) -> None:
        self._slots: ExecSlots | None = slots

    def release(self) -> None:
        if self._slots is not None:
            self._slots.in_use -= 1
            self._slots = None


class ExecSlots:
    """At most ``limit`` commands and file transfers of one sandbox (``name``: "the
    sandbox ID") at a time; no waiting."""

    def __init__(self, limit: int, name: str) -> None:
        self.limit = limit
        self.name = name
        self.in_use = 0

    def take(self) -> ExecSlot:
        """A slot, or Capacity when all are taken (runs on the event loop: no lock needed)."""
        if self.in_use >= self.limit:
            raise Capacity(
                f"{self.name} already runs {self.limit} commands or file "
                "transfers, the most a session may run at once; retry when one has ended",
                RETRY_AFTER_S,
            )
        self.in_use += 1
        return ExecSlot(self)
