"""Creates that a client may retry: ``Idempotency-Key`` on ``POST /v1/sessions``.

A create that times out on the client's side (a VM's boot, a network blip) may still have
made its session, which then runs unseen until its idle timeout and counts against the
key's cap. Sent again with the same key, the create answers the session the first one made
(its current state; a retry that waits for ``running`` waits for that session's start)
instead of a second one. The key is remembered with the session's record, as long as the
registry keeps the session; the same key with another request is refused, as reusing a key
by mistake would otherwise hand out a session made for something else.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable

from ..errors import InvalidRequest
from ..schemas.sessions import SessionCreate
from .lifecycle import Idempotency, SessionRecord

__all__ = ["IdempotentCreates", "idempotency_of"]


def idempotency_of(key: str, body: SessionCreate) -> Idempotency:
    """The key and a digest of what the create asks for: its body with every default
    filled in and keys sorted, so that the same request spelled differently matches."""
    canonical = json.dumps(body.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return Idempotency(key, hashlib.sha256(canonical.encode()).hexdigest())


Find = Callable[[str, str], Awaitable[SessionRecord | None]]


class IdempotentCreates:
    """One create per (API key, Idempotency-Key) at a time in this server: a retry that
    arrives while the first is still being made waits for it, then finds its session."""

    def __init__(self, find: Find) -> None:
        self._find = find
        self._making: dict[tuple[str, str], asyncio.Event] = {}

    async def create(
        self, owner: str, wanted: Idempotency, make: Callable[[], Awaitable[SessionRecord]],
    ) -> tuple[SessionRecord, bool]:
        """The session made for ``wanted`` before (and True), else ``make()``'s (and False)."""
        slot = (owner, wanted.key)
        while (making := self._making.get(slot)) is not None:
            await making.wait()
        made = asyncio.Event()
        self._making[slot] = made  # no await since the look above: one maker per slot
        try:
            found = await self._find(owner, wanted.key)
            if found is not None:
                if found.idempotency != wanted:
                    raise InvalidRequest(
                        f"the Idempotency-Key {wanted.key!r} was sent with another request, "
                        f"which made session {found.id}; use a new key for a new session")
                return found, True
            return await make(), False
        finally:
            del self._making[slot]
            made.set()
