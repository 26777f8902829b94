"""Who drives a session: its agent (through the API) or a human in the live view.

A human with a control link takes control (a lease, 10 minutes by default); the API's
actions that change the desktop then answer 409 ``human_in_control`` until the human hands
back or the lease runs out, while looking (screenshots, zoom, the cursor, the clipboard)
goes on. The agent may ask for help: that is shown to humans (an event, the session's
handoff state) and can be waited for until a human has taken control and handed back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from ..errors import HumanInControl
from ..schemas import actions as a
from ..schemas.handoff import Handoff
from .lifecycle import utcnow

__all__ = ["HandoffState"]

# What an agent may still do while a human drives: nothing of it reaches the desktop's input.
_LOOKING = (a.Screenshot, a.Zoom, a.Wait, a.CursorPosition, a.ScreenSize, a.ClipboardGet)

Publish = Callable[..., object]  # EventLog.publish bound to the session


class HandoffState:
    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self.since: datetime | None = None
        self.until: datetime | None = None
        self.reason: str | None = None
        self.requested_at: datetime | None = None
        self.handed_back_at: datetime | None = None
        self._holder: str | None = None  # who took control (a token's id, or the key)
        self._expiry: asyncio.TimerHandle | None = None
        self._handed_back = asyncio.Event()
        self._waiting = 0

    @property
    def human_in_control(self) -> bool:
        return self.until is not None

    @property
    def in_use(self) -> bool:
        """A human drives the session, or its agent waits for one: the session is in use,
        whatever its idle clock says (neither moves it)."""
        return self.until is not None or self._waiting > 0

    def resource(self) -> Handoff:
        return Handoff(human_in_control=self.human_in_control, since=self.since,
                       until=self.until, needs_help=self.requested_at is not None,
                       reason=self.reason, requested_at=self.requested_at,
                       handed_back_at=self.handed_back_at)

    def check(self, actions: Sequence[a.Action]) -> None:
        """HumanInControl (409) for a batch that would touch the desktop while a human
        drives it."""
        if self.until is not None and not all(isinstance(x, _LOOKING) for x in actions):
            raise HumanInControl(
                f"a human is in control of this session until {self.until.isoformat()} "
                "(or until they hand it back): screenshots work, actions wait; POST "
                "/handoff?wait=true waits for the hand-back")

    def take(self, lease_s: int, holder: str) -> None:
        """``holder`` (a control token's id, or the owner's key) takes control, or renews
        the lease it holds. HumanInControl (409) while another holds it: both their pages
        would say "you are in control" and offer the hand-back."""
        now = utcnow()
        if self.until is not None and holder != self._holder:
            raise HumanInControl(
                f"a human is in control of this session already, until "
                f"{self.until.isoformat()} (or until they hand it back)")
        self._holder = holder
        if self.until is None:
            self.since = now
            self._handed_back.clear()
        self.until = now + timedelta(seconds=lease_s)
        self.requested_at = self.reason = None  # the help asked for has come
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = asyncio.get_running_loop().call_later(
            lease_s, self.hand_back, "the lease ran out")
        self._publish("human_took_control")

    def hand_back(self, why: str = "handed back") -> None:
        if self.until is None:
            return
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.since = self.until = self._holder = None
        # A request asked while the human drove is answered by this hand-back, as its
        # wait is: it no longer needs help (the take cleared those asked before it).
        self.requested_at = self.reason = None
        self.handed_back_at = utcnow()
        self._handed_back.set()
        self._publish("human_handed_back", reason=why)

    def ask(self, reason: str) -> None:
        self.reason, self.requested_at = reason, utcnow()
        self._handed_back.clear()
        self._publish("help_requested", reason=reason)

    async def wait_handed_back(self, timeout_s: float) -> None:
        """Until a human has handed the session back (after taking it), or ``timeout_s``."""
        self._waiting += 1
        try:
            await asyncio.wait_for(self._handed_back.wait(), timeout_s)
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1

    def close(self) -> None:
        """The session ended: no lease timer outlives it, and waiters are let go."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._handed_back.set()
