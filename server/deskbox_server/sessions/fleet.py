"""This server's part in a fleet of servers that share one registry
(``DESKBOX_REGISTRY=cluster``, shared_registry.py): any of them serves any session.

A request for a running session another server started makes this one take it over (its
own stream to the session's agent, as after a restart; both then hold it). A session
another server ended is let go of here, at the next request for it or the next reaper
pass. Each pass also keeps the idle clocks in step (the latest request through any server
counts), stops the expired sessions no server holds, and ends the ones a server that
stopped (killed, or its node lost) left starting or stopping: no other server moves those
on. The session table (manager.py) keeps the sessions; this module decides when they move.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Protocol

from ..errors import Capacity, Conflict, DeskboxError, SessionFailed
from ..schemas.sessions import SessionState as S
from .lifecycle import LIVE_STATES, SessionRecord, utcnow
from .live import LiveSession, not_live
from .recovery import failed
from .shared_registry import SharedRegistry

__all__ = ["Fleet", "FleetHost"]

log = logging.getLogger("deskbox.sessions")
# How often a server sweeps the fleet's records of long-ended sessions.
_SWEEP_S = 60.0
# A newer idle clock than the fleet's by more than this is pushed to it.
_CLOCK_SLACK = dt.timedelta(seconds=1)
# Servers holding a session push its clock every pass: this many passes past its expiry,
# none holds it.
_UNHELD_PASSES = 3
# A session this server cannot reach is failed for the whole fleet only once its takeovers
# have failed for this many passes: one failed connection may be a passing network fault.
_UNREACHABLE_PASSES = 2


class FleetHost(Protocol):
    """What the fleet's logic needs of the session table (manager.py)."""

    @property
    def holding(self) -> Mapping[str, LiveSession]: ...

    async def adopt_running(self, record: SessionRecord) -> LiveSession | str:
        """Hold the running session of another server: the session, or why not."""
        ...

    async def hand_over(self, live: LiveSession, ended: SessionRecord | None) -> None: ...

    async def record_failure(self, record: SessionRecord, reason: str) -> None:
        """Fail the session for the fleet, and remove what is left of its sandbox."""
        ...

    def stop_soon(self, live: LiveSession) -> None: ...

    async def remove_left(self, record: SessionRecord) -> None:
        """Remove what a server that stopped left of the ended session's sandbox."""
        ...


class Fleet:
    def __init__(self, registry: SharedRegistry, host: FleetHost, max_per_key: int,
                 retry_after_s: int, reaper_interval_s: float,
                 stuck_after_s: Mapping[S, float]) -> None:
        """``stuck_after_s``: for ``starting`` and ``stopping``, how long a record may stay
        unchanged while a server moves it on (longer than any start or stop takes)."""
        self._registry = registry
        self._host = host
        self._max_per_key = max_per_key
        self._retry_after_s = retry_after_s
        self._interval = dt.timedelta(seconds=reaper_interval_s)
        # Sessions being taken over: one takeover each, whoever asks; and whether it is a
        # patient one (_taking_over).
        self._takeovers: dict[str, tuple[asyncio.Task[LiveSession], bool]] = {}
        # When a takeover of each session first failed, in the current run of failures.
        self._unreachable_since: dict[str, float] = {}
        self._swept_at = 0.0
        self._stuck_after_s = stuck_after_s
        # The starting and stopping records no server here holds: the version each was
        # first seen at, and when (this server's clock: the fleet's may disagree).
        self._unchanged: dict[str, tuple[str, float]] = {}

    @property
    def clock_grace(self) -> dt.timedelta:
        """How late another server's requests may reach our idle clock: one pass."""
        return self._interval

    async def reach(self, owner: str, session_id: str) -> LiveSession | None:
        """The fleet's running session ``session_id`` of ``owner``, held here from now on;
        None if the fleet has no such session; not_live's error if it does not run."""
        record = await self._registry.get(session_id)
        if record is None or record.owner != owner:
            return None
        if record.state is not S.running:
            raise not_live(record)
        return await self._taking_over(record)

    async def reach_to_delete(self, record: SessionRecord) -> LiveSession | None:
        """The fleet's session, held here to be stopped; None if it ended (or ends
        meanwhile)."""
        if record.state is S.starting:
            raise Conflict(f"session {record.id} is still starting on another server; "
                           "delete it once it runs")
        if record.state is not S.running:
            return None
        try:
            return await self._taking_over(record, patient=False)
        except DeskboxError:
            now = await self._registry.get(record.id)
            if now is not None and now.state in LIVE_STATES:
                raise
            return None

    async def _taking_over(self, record: SessionRecord, patient: bool = True) -> LiveSession:
        """Held here, taken over if need be. ``patient``: a session this server cannot
        reach fails only after a while (502 until then); else at once (it is to end)."""
        entry = self._takeovers.get(record.id)
        if entry is None or entry[0].done():
            entry = (asyncio.create_task(self._take_over(record, patient)), patient)
            self._takeovers[record.id] = entry
            entry[0].add_done_callback(lambda done: self._drop_takeover(record.id, done))
        task, shared_patience = entry
        try:
            return await asyncio.shield(task)
        except SessionFailed:
            if patient or not shared_patience:
                raise
            # The attempt this caller joined was a patient one, whose failure only says
            # "try again"; this caller ends the session (a delete), so it tries on its own.
            return await self._taking_over(record, patient=False)

    def _drop_takeover(self, session_id: str, done: asyncio.Task[LiveSession]) -> None:
        if self._takeovers.get(session_id, (None, True))[0] is done:
            del self._takeovers[session_id]

    async def _take_over(self, record: SessionRecord, patient: bool = True) -> LiveSession:
        held = self._host.holding.get(record.id)
        if held is not None:
            return held
        live = await self._host.adopt_running(record)
        if not isinstance(live, str):
            self._unreachable_since.pop(record.id, None)
            log.info("session %s taken over from the fleet (engine %s)", record.id,
                     record.backend)
            return live
        now = await self._registry.get(record.id)
        if now is not None and now.state is not S.running:
            raise not_live(now)  # ended by its server meanwhile
        # readopt's reasons are a restarted server's.
        reason = live.replace("the server restarted and could not re-adopt it",
                              "no server of the fleet could reach it")
        if patient and not self._unreachable_for_long(record.id):
            raise SessionFailed(
                f"session {record.id} runs, but this server could not reach its desktop "
                f"({reason}); try again")
        self._unreachable_since.pop(record.id, None)
        await self._host.record_failure(record, reason)
        raise not_live(record)

    def _unreachable_for_long(self, session_id: str) -> bool:
        """Note a failed takeover; whether they have failed for _UNREACHABLE_PASSES."""
        now = time.monotonic()
        give_up_s = _UNREACHABLE_PASSES * self._interval.total_seconds()
        for other, since in list(self._unreachable_since.items()):
            if now - since > 4 * give_up_s:  # nobody asked again: forget it
                del self._unreachable_since[other]
        since = self._unreachable_since.setdefault(session_id, now)
        return now - since >= give_up_s

    async def ended_elsewhere(self, session_id: str) -> SessionRecord | None:
        """The fleet's record of a session this server holds, if another server ended it
        (or is ending it)."""
        try:
            record = await self._registry.get(session_id)
        except DeskboxError as error:
            log.warning("session %s: reading the fleet's record: %s", session_id, error)
            return None
        if record is None or record.state in (S.starting, S.running):
            return None
        return record

    async def check_capacity(self, owner: str, count: int = 1) -> None:
        """The API key's cap over the whole fleet (soft: two servers creating at once may
        both pass)."""
        mine = sum(1 for r in await self._registry.owned(owner) if r.state in LIVE_STATES)
        if mine + count > self._max_per_key:
            raise Capacity(f"this API key has its maximum of {self._max_per_key} live "
                           "sessions; delete one first", self._retry_after_s)

    async def reconcile(self) -> None:
        """One reaper pass: let go of sessions another server ended, keep the idle clocks
        in step, stop the expired sessions no server holds, sweep old records."""
        versions = {r.id: (r, version) for r, version in await self._registry.live_versions()}
        for live in list(self._host.holding.values()):
            await self._keep_in_step(live, *versions.get(live.record.id, (None, "")))
        now = utcnow()
        for record, _ in versions.values():
            if (record.id in self._host.holding or record.state is not S.running
                    or record.expires_at is None
                    or now <= record.expires_at + _UNHELD_PASSES * self._interval):
                continue
            log.info("session %s idle for %d s, held by no server: stopping it", record.id,
                     record.timeout_s)
            with suppress(DeskboxError):
                self._host.stop_soon(await self._taking_over(record, patient=False))
        await self._end_stuck(list(versions.values()))
        if time.monotonic() - self._swept_at > _SWEEP_S:
            self._swept_at = time.monotonic()
            if swept := await self._registry.sweep():
                log.info("forgot the records of %d long-ended sessions", len(swept))

    async def _end_stuck(self, versions: list[tuple[SessionRecord, str]]) -> None:
        """End the sessions whose record has stayed ``starting`` or ``stopping`` longer
        than a server takes to move it on: the server that was doing so has stopped. A
        start cut short fails, a delete cut short is done; then what is left of the
        sandbox goes. Each only over the record as it was read (a late server wins)."""
        now = time.monotonic()
        unchanged = {}
        for record, version in versions:
            limit = self._stuck_after_s.get(record.state)
            if limit is None or record.id in self._host.holding:
                continue
            seen = self._unchanged.get(record.id)
            since = seen[1] if seen is not None and seen[0] == version else now
            if now - since < limit:
                unchanged[record.id] = (version, since)
                continue
            if record.state is S.starting:
                failed(record, "the server starting it stopped before it ran")
            else:
                record.transition(S.stopped)
            try:
                if not await self._registry.save_if(record, version):
                    continue
            except DeskboxError as error:
                log.warning("session %s: ending it for a server that stopped: %s",
                            record.id, error)
                continue
            log.warning("session %s %s: the server %s it stopped", record.id,
                        record.state.value,
                        "starting" if record.state is S.failed else "stopping")
            await self._host.remove_left(record)
        self._unchanged = unchanged

    async def _keep_in_step(self, live: LiveSession, shared: SessionRecord | None,
                            version: str) -> None:
        record = live.record
        if live.stop_task or live.changing.locked() or record.state is not S.running:
            return
        if shared is None or shared.state is S.stopping:
            ended = shared or await self.ended_elsewhere(record.id)
            if ended is not None:
                await self._host.hand_over(live, ended)
            return
        if (shared.state is not S.running  # listed before our own start ended
                or shared.expires_at is None or record.expires_at is None):
            return
        if shared.expires_at > record.expires_at:
            record.expires_at = shared.expires_at
        elif record.expires_at > shared.expires_at + _CLOCK_SLACK:
            # Only over the record as it was read: another server's state change since
            # (a delete) wins, and the next pass reads it.
            await self._registry.save_if(record, version)
