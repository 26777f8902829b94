"""The table of sessions: create, find, keep alive and stop them; caps; idle expiry;
recovery at start. Snapshots and forks of a session are copies.py's.

The manager owns the live sessions of this process (their desktops, desktop.py) and keeps the
registry in step with every state change; in a fleet of servers that share their registry,
fleet.py decides when a session moves between them. What one session does (actions,
screenshots, exec and files, the live view, DevTools, pause and resume) is its
:class:`Session` (session.py), which :meth:`SessionManager.session` hands out. Requests
reach it already parsed; it raises only ``DeskboxError`` subclasses.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import datetime as dt
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Literal

from ..engines import AnyEngine, Capability, SessionSpec, StartTogether, VolumeAttach
from ..errors import (
    Capacity,
    Conflict,
    DeskboxError,
    InsufficientStorage,
    InvalidRequest,
    NotFound,
    SessionFailed,
)
from ..metrics import Metrics
from ..schemas.health import EngineSummary
from ..schemas.secrets import SecretCreate
from ..schemas.sessions import SessionCreate, SessionState
from ..settings import Settings
from . import start_stop
from .browser_watch import BrowserWatch
from .catalog import SnapshotCatalog
from .context import SessionContext
from .copies import SessionCopies
from .desktop import AnyDesktop
from .events import EventLog
from .fleet import Fleet
from .fork_scratch import ForkDirectories
from .idempotency import IdempotentCreates, idempotency_of
from .in_flight import ChangesInFlight
from .lifecycle import LIVE_STATES, Idempotency, SessionRecord, utcnow
from .links import SessionLinks
from .listing import Position, SessionQuery, encode_cursor, position
from .live import LiveSession, not_live, one_server_only
from .pause import FrameStore
from .pool import PoolKey, SnapshotKey, WarmPool, new_session_id
from .recording_store import RecordingStore
from .recordings import Recordings
from .recovery import desktop_spec, failed, lock_state_dir, readopt, readopt_each
from .registry import Registry
from .secrets import SecretRecord, SecretStore
from .session import Session
from .shared_registry import SharedRegistry
from .snapshots import SnapshotStore
from .tokens import TokenStore
from .volumes import VolumeStore

__all__ = ["LiveSession", "SessionManager"]

log = logging.getLogger("deskbox.sessions")
_RECENT = 1024
# Ended sessions are forgotten in a reaper pass at most this often (one indexed DELETE).
_FORGET_EVERY_S = 60.0
# Less free in the state dir than this makes GET /healthz say so: a hibernate needs about
# what its session holds in memory, compressed.
LOW_DISK_BYTES = 256 << 20
S = SessionState


class SessionManager:
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        engines: Mapping[str, AnyEngine],
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._registry = registry
        # By the name a session's ``backend`` gives on the wire (API.md).
        self._engines = dict(engines)
        self._live: dict[str, LiveSession] = {}
        self._ended: dict[SessionState, int] = {}
        # Sessions that ended lately, so that acting on one says why without a query.
        self._recent: OrderedDict[str, SessionRecord] = OrderedDict()
        # Ended sessions whose end the registry could not take (a full disk): the truth
        # until a reaper pass saves them.
        self._unsaved: dict[str, SessionRecord] = {}
        self._reaper: asyncio.Task[None] | None = None
        # Creates sent with an Idempotency-Key (idempotency.py).
        self._creates = IdempotentCreates(registry.by_idempotency_key)
        # Removals of desktops that outlasted stop_timeout_s: they go on in the background.
        self._removals: set[asyncio.Task[None]] = set()
        self._lock_fd: int | None = None
        # This server's part in a fleet that shares the registry (fleet.py), if it does.
        self._fleet = Fleet(
            registry, self, settings.max_sessions_per_key, settings.retry_after_s,
            settings.reaper_interval_s, self._stuck_after_s(),
        ) if isinstance(registry, SharedRegistry) else None
        # GET /v1/sessions/{id}/events: state changes, browser exits and restarts.
        self.events = EventLog()
        self._browsers = BrowserWatch(self.events)
        # VNC viewers and DevTools sockets, closed before a checkpoint (links.py).
        self.links = SessionLinks()
        self.snapshots = SnapshotStore(settings.state_dir / "snapshots")
        self._forks = ForkDirectories(
            self.snapshots.forks_on_disk,
            Path(settings.scratch_dir) if settings.scratch_dir else None,
            settings.state_dir)
        # /v1/volumes, and the volumes sessions have attached (volumes.py).
        self.volumes = VolumeStore(settings.state_dir / "volumes", settings.volume_quota_mb)
        # /v1/secrets (secrets.py), encrypted under the key in the state dir.
        self.secrets = SecretStore(settings.state_dir / "secrets",
                                   settings.state_dir / "secrets.key")
        self._frames = FrameStore(settings.state_dir / "frames")
        # Session tokens (tokens.py): kept with the fleet's shared records, if any.
        self.tokens = TokenStore(
            shared=registry.records if isinstance(registry, SharedRegistry) else None)
        # Recordings of sessions, kept past them (recordings.py, recording_store.py).
        self.recordings = Recordings(
            RecordingStore(settings.state_dir / "recordings",
                           dt.timedelta(hours=settings.recording_ttl_h)),
            self.events, settings.recording_fps, settings.recording_quality,
            settings.recording_quota_mb << 20,
        )
        pool_engine = self._engines.get(settings.default_backend)
        self.pool = WarmPool(
            pool_engine, [PoolKey.parse(d) for d in settings.pool_displays],
            settings.pool_size, pool_engine.start_timeout(settings.start_timeout_s),
            settings.desktop_call_timeout_s,
        ) if pool_engine is not None else None
        # GET/DELETE /v1/snapshots and the snapshots' pools (catalog.py).
        self.catalog = SnapshotCatalog(self.snapshots, self.pool, settings.max_sessions_per_key,
                                       self._engines)
        changes = ChangesInFlight()
        self._context = SessionContext(
            registry=registry, browsers=self._browsers, links=self.links, frames=self._frames,
            metrics=metrics, publish=self._publish_state, fail=self._fail_soon,
            volumes=self.volumes, secrets=self.secrets, events=self.events,
            recordings=self.recordings, changes=changes, tokens=self.tokens,
        )
        # POST /v1/sessions/{id}/snapshots and /fork (copies.py).
        self.copies = SessionCopies(
            self, self.snapshots, self.catalog, self._forks, changes, self._fleet,
            settings.snapshot_quota_mb, self._removals,
        )

    # -- server lifetime ------------------------------------------------------------------

    async def start(self) -> None:
        """Prepare the engines (may build the session image), then recover what a previous
        server left: running sessions whose desktop still runs are re-adopted, the other
        live ones are marked failed, and sandboxes the registry does not know are removed.
        """
        self._lock_fd = await asyncio.to_thread(lock_state_dir, self._settings.state_dir)
        try:
            await self._recover()
        except BaseException:
            for live in self._live.values():  # re-adopted: let go, leave the desktop running
                await self._browsers.stop(live.record.id)
                if live.handle is not None:
                    await live.handle.let_go()
            self._live.clear()
            await asyncio.to_thread(self._forks.close)
            for engine in self._engines.values():
                with suppress(Exception):
                    await engine.close()
            await self._registry.close()
            os.close(self._lock_fd)
            self._lock_fd = None
            raise
        self._reaper = asyncio.create_task(self._reap_forever(), name="deskbox-reaper")
        if self.pool is not None:
            for snapshot in await asyncio.to_thread(self.snapshots.all):
                # A pool kept for a snapshot of an engine that is now another's default
                # cannot be served (its size stays saved for a server that can).
                if snapshot.pool_size and snapshot.backend == self.pool.backend:
                    await self.pool.set_target(self.catalog.pool_key(snapshot), snapshot.pool_size)
                elif not snapshot.pool_size:  # what an earlier server left unpacked
                    await self.catalog.drop_unpacked(snapshot)
            self.pool.start()

    async def _recover(self) -> None:
        await self._registry.open()
        await asyncio.to_thread(self.snapshots.open)
        forks = any(Capability.CHECKPOINT in e.capabilities for e in self._engines.values())
        await asyncio.to_thread(self._forks.open, forks)
        await asyncio.to_thread(self.volumes.open)
        await asyncio.to_thread(self.secrets.open)
        await asyncio.to_thread(self._frames.open)
        await asyncio.to_thread(self.recordings.store.open)
        for engine in self._engines.values():
            await engine.prepare()
        # This process holds no desktop yet: what the registry calls live was left by a
        # previous server. In a fleet, by any server: each is taken over on its first
        # request here, and none of them is an orphan.
        adopted: dict[str, set[str]] = {name: set() for name in self._engines}
        left = await self._registry.live()
        if self._fleet is not None:
            for record in left:
                adopted.setdefault(record.backend, set()).add(record.id)
        else:
            for record, kept in zip(left, await readopt_each(left, self._adopt_or_fail),
                                    strict=True):
                if kept:
                    adopted[record.backend].add(record.id)
        for name, engine in self._engines.items():
            removed = await engine.remove_orphans(adopted[name])
            if removed:
                log.info("removed %d orphaned %s sandboxes: %s", len(removed), name,
                         ", ".join(removed))
        self._ended = {
            state: count
            for state, count in (await self._registry.count_by_state()).items()
            if state not in LIVE_STATES
        }
        for ended in self._unsaved.values():  # the registry still calls them live
            if ended.state not in LIVE_STATES:
                self._ended[ended.state] = self._ended.get(ended.state, 0) + 1

    async def _adopt_or_fail(self, record: SessionRecord) -> bool:
        """Re-adopt a session a previous server left running, else fail it with why;
        whether it was."""
        reason = await self._adopt(record)
        if reason is None:
            return True
        log.warning("session %s failed: %s", record.id, reason)
        ended = failed(record, reason)
        if not await start_stop.save_end(self._registry, ended):
            self._unsaved[record.id] = ended
        # A hibernated session's last frame (pause.py) is of no use any more.
        await asyncio.to_thread(self._frames.forget, record.id)
        return False

    async def _adopt(self, record: SessionRecord) -> str | None:
        """Re-adopt a session a previous server left running; None, or why it failed."""
        live = await readopt(
            record, self._engines.get(record.backend), self._frames,
            self._settings.desktop_call_timeout_s,
        )
        if isinstance(live, str):
            return live
        self._live[record.id] = live
        self.volumes.reattach(record.owner, record.id, record.body.all_volumes())
        if record.state is S.running and live.handle is not None:
            # Its use (actions, commands, DevTools) moved its idle clock in the previous
            # server's memory only, and the restart was no idleness of its own: a fresh
            # clock, or the first reaper pass stopped a session in use as expired.
            record.touch()
            self._context.watch(record.id, live.handle)
        try:  # its clock, or a hibernation it was not told of
            await self._registry.save(record)
        except InsufficientStorage:  # a full disk does not stop the server's start
            self._unsaved[record.id] = record
        log.info("session %s re-adopted (engine %s, %s)", record.id, record.backend,
                 record.state.value)
        return None

    async def shutdown(self) -> None:
        """Stop every live session (no process left behind), then close the registry."""
        if self._reaper is not None:
            self._reaper.cancel()
            with suppress(asyncio.CancelledError):
                await self._reaper
        if self.pool is not None:
            await self.pool.close()
        await self.recordings.close()
        # A snapshot that outlasted the requests' grace is given stop_timeout_s to end.
        # (A hibernate or resume holds its session's lock, which _let_go waits for: it
        # ends whatever this bound, and a hibernated session stays on disk.)
        await self._context.changes.wait(self._settings.stop_timeout_s)
        # Hibernated sessions stay on disk for the next server; in a fleet, running ones
        # stay for the other servers; the others stop.
        await asyncio.gather(
            *(self._let_go(live) if live.record.state is S.hibernated
              else self.hand_over(live) if self._handed_over_at_shutdown(live)
              else self._stop(live, None) for live in list(self._live.values())),
            return_exceptions=True,
        )
        if self._removals:  # a last chance, bounded, for removals that overran
            await asyncio.wait(self._removals, timeout=self._settings.stop_timeout_s)
        await asyncio.to_thread(self._forks.close)
        for engine in self._engines.values():
            with suppress(Exception):
                await engine.close()
        # A last try at the ends not saved yet: the next server would otherwise take such a
        # session for one still running and fail it as left behind by the restart.
        try:
            await self._save_unsaved()
        except Exception:
            log.exception("saving the sessions' ends at shutdown")
        if self._unsaved:
            log.error("%d ended sessions are not saved (the disk refuses writes): the next "
                      "server will count them as failed", len(self._unsaved))
        await self._registry.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the state dir's lock
            self._lock_fd = None

    def _handed_over_at_shutdown(self, live: LiveSession) -> bool:
        return (self._fleet is not None and live.record.state is S.running
                and live.stop_task is None and live.handle is not None)

    async def hand_over(self, live: LiveSession, ended: SessionRecord | None = None) -> None:
        """Let go of a session the fleet's other servers serve (or one of them ended:
        ``ended``, its record), leaving its desktop as it is."""
        session_id = live.record.id
        if self._live.get(session_id) is not live:
            return
        del self._live[session_id]
        if ended is not None:
            live.record = ended
            self._remember_ended(ended)
        await self._context.unwatch(session_id)
        if live.handle is not None:
            try:
                await live.handle.hand_over()
            except Exception:
                log.exception("letting go of session %s", session_id)
        log.info("session %s: left to the fleet's other servers", session_id)

    async def _let_go(self, live: LiveSession) -> None:
        async with live.changing:  # not while a resume restores it
            if live.record.state is S.hibernated and live.stop_task is None:
                self._live.pop(live.record.id, None)
                if live.handle is not None:
                    try:
                        await live.handle.release()
                    except Exception:
                        log.exception("releasing hibernated session %s", live.record.id)
                log.info("session %s stays hibernated for the next server", live.record.id)
                return
        await self._stop(live, None)

    # -- volumes ------------------------------------------------------------------------

    async def delete_volume(self, owner: str, name: str) -> None:
        """Delete a volume (409 while attached), then what engines keep of it (a cluster's
        claim): a failure there is logged, the volume is gone for the API either way."""
        await self.volumes.delete(owner, name)
        for engine in self._engines.values():
            try:
                await engine.drop_volume(f"{owner}/{name}")
            except DeskboxError as error:
                log.warning("volume %s of %s: the %s engine kept its copy: %s", name, owner,
                            engine.name, error.message)

    # -- queries --------------------------------------------------------------------------

    async def store_secret(self, owner: str, body: SecretCreate) -> SecretRecord:
        """POST /v1/secrets. Refused in a fleet: the secret would be kept in this server's
        state dir under its own key, and the request that types it may reach another."""
        if self._fleet is not None:
            raise one_server_only("a stored secret (POST /v1/secrets)")
        return await asyncio.to_thread(self.secrets.create, owner, body)

    def describe_engines(self) -> dict[str, EngineSummary]:
        """Each engine sessions may ask for (its name on the wire): what it can do, and
        what an operator should know of it on this host (``GET /healthz``)."""
        return {
            name: EngineSummary(
                capabilities=sorted(c.value for c in engine.capabilities),
                egress=sorted(engine.egress_modes),
                details=engine.describe(),
            )
            for name, engine in self._engines.items()
        }

    async def problems(self) -> builtins.list[str]:
        """What keeps sessions from starting or saving now (``GET /healthz``): an engine
        that cannot start sandboxes, a state dir nearly full."""
        names = list(self._engines)
        found = await asyncio.gather(*(self._engines[name].problem() for name in names))
        problems = [f"engine {name}: {problem}" for name, problem in zip(names, found, strict=True)
                    if problem is not None]
        free = (await asyncio.to_thread(shutil.disk_usage, self._settings.state_dir)).free
        if free < LOW_DISK_BYTES:
            problems.append(
                f"the state dir {self._settings.state_dir} has {free >> 20} MiB free: "
                "hibernates, snapshots and the registry's writes may fail (507)")
        return problems

    def engine_details(self, backend: str) -> dict[str, str]:
        """What an operator should know of ``backend``'s engine here ({} if not offered)."""
        engine = self._engines.get(backend)
        return engine.describe() if engine is not None else {}

    def counts_by_state(self) -> dict[str, int]:
        counts = {state.value: 0 for state in S}
        for state, count in self._ended.items():
            counts[state.value] += count
        for live in self._live.values():
            counts[live.record.state.value] += 1
        return counts

    async def get(self, owner: str, session_id: str) -> SessionRecord:
        live = self._live.get(session_id)
        mine = live.record if live is not None and live.record.owner == owner else None
        if mine is None and (unsaved := self._unsaved.get(session_id)) is not None:
            mine = unsaved if unsaved.owner == owner else None
        if mine is not None and self._fleet is None:
            return mine
        record = await self._registry.get(session_id)
        # In a fleet the shared record is the truth, unless only our idle clock is newer.
        if mine is not None and (record is None or record.state is mine.state):
            return mine
        if record is None or record.owner != owner:
            raise NotFound(f"no session {session_id!r}")
        return record

    async def list(self, query: SessionQuery) -> tuple[list[SessionRecord], str | None]:
        """One page of ``query``, newest first, and the cursor of the next (None: the last)."""
        records, more = await self._registry.page(query)
        end = position(records[-1]) if more else None
        page = [self._listed(r) for r in records]
        if self._fleet is None:
            page += self._left_out(query, {r.id for r in records}, end)
        # Filtered by the state shown: the registry's page was chosen by its own.
        shown = sorted((r for r in page if not query.states or r.state in query.states),
                       key=position, reverse=True)
        if len(shown) > query.limit:  # sessions of ours filled the page past its limit
            shown = shown[:query.limit]
            end = position(shown[-1])
        return shown, encode_cursor(end) if end is not None else None

    def _listed(self, record: SessionRecord) -> SessionRecord:
        """What the listing shows of the registry's ``record``: what :meth:`get` says.
        A session this server holds: its record here, whose state changes before the
        registry hears of it (a pause under way, a save the disk refused) and whose idle
        clock is newer; in a fleet, only while the states agree (the fleet's record is the
        truth). One whose end the registry could not take yet (a full disk): its record
        here (the registry still says running)."""
        live = self._live.get(record.id)
        if live is not None and (self._fleet is None or live.record.state is record.state):
            return live.record
        return self._unsaved.get(record.id, record)

    def _left_out(self, query: SessionQuery, seen: set[str], end: Position | None
                  ) -> builtins.list[SessionRecord]:
        """Sessions of this server that ``query`` asks for by their state here, which the
        registry's page (its ids ``seen``, down to ``end``) left out by the state the
        registry has of them."""
        ours = dict(self._unsaved)
        ours.update((session_id, live.record) for session_id, live in self._live.items())
        return [r for r in ours.values() if r.id not in seen and query.matches(r)
                and (end is None or position(r) > end)]

    async def session(
        self, owner: str, session_id: str, missing: Literal["live", "running"] = "running"
    ) -> Session:
        """A live session of ``owner``: what the API acts on (session.py). One that ended
        lately says why; one never seen (or not this key's) is ``no {missing} session``.
        The Session checks the state each of its calls needs. In a fleet, a running
        session another server started is taken over here first."""
        live = self._live.get(session_id)
        if live is None and self._fleet is not None:
            live = await self._fleet.reach(owner, session_id)
        return self._session_of(live, owner, session_id, missing)

    def held(
        self, owner: str, session_id: str, missing: Literal["live", "running"] = "running"
    ) -> Session:
        """:meth:`session`, among the sessions this server holds (no await)."""
        return self._session_of(self._live.get(session_id), owner, session_id, missing)

    def _session_of(
        self, live: LiveSession | None, owner: str, session_id: str, missing: str
    ) -> Session:
        if live is None or live.record.owner != owner:
            ended = self._recent.get(session_id)
            if ended is not None and ended.owner == owner:
                raise not_live(ended)
            raise NotFound(f"no {missing} session {session_id!r}")
        return Session(live, self._context)

    def handle(self, owner: str, session_id: str) -> AnyDesktop:
        """The desktop of a running session of ``owner`` (for tests)."""
        return self.held(owner, session_id).handle

    # -- for fleet.py ---------------------------------------------------------------------

    @property
    def holding(self) -> Mapping[str, LiveSession]:
        """The sessions this server holds."""
        return self._live

    async def adopt_running(self, record: SessionRecord) -> LiveSession | str:
        """Hold a running session another server of the fleet started; or why not."""
        live = await readopt(record, self._engines.get(record.backend), self._frames,
                             self._settings.desktop_call_timeout_s)
        if isinstance(live, str):
            return live
        self._live[record.id] = live
        if live.handle is not None:
            self._context.watch(record.id, live.handle)
        return live

    async def record_failure(self, record: SessionRecord, reason: str) -> None:
        log.warning("session %s failed: %s", record.id, reason)
        await self._registry.save(failed(record, reason))
        await asyncio.to_thread(self._frames.forget, record.id)
        self._publish_state(record)
        # No server holds it from now on (one that did lets go of a failed session): what
        # is left of its sandbox goes now, or it runs on for good (a pod this server could
        # not reach, one whose token is gone, one that ended on its own).
        await self._remove_sandbox(record)

    def stop_soon(self, live: LiveSession) -> None:
        if live.stop_task is None:
            live.stop_task = asyncio.create_task(self._end(live, None))

    def _stuck_after_s(self) -> dict[SessionState, float]:
        """How long a fleet's record stays starting or stopping at most while its server
        lives: a start is bounded by its engine's timeout, then ended (a stop) if it
        failed; a stop by twice stop_timeout_s (a resume's restore, then the removal). A
        minute more for the saves and the reaper's passes."""
        settings = self._settings
        start_s = max((engine.start_timeout(settings.start_timeout_s)
                       for engine in self._engines.values()), default=settings.start_timeout_s)
        stop_s = 2 * settings.stop_timeout_s
        slack_s = 60.0 + 2 * settings.reaper_interval_s
        return {S.starting: start_s + stop_s + slack_s, S.stopping: stop_s + slack_s}

    async def remove_left(self, record: SessionRecord) -> None:
        self._publish_state(record)
        await self._remove_sandbox(record)

    async def _remove_sandbox(self, record: SessionRecord) -> None:
        engine = self._engines.get(record.backend)
        if engine is None:
            return
        try:
            await engine.remove_left(record.id)
        except Exception:
            log.exception("removing what is left of session %s", record.id)

    # -- lifecycle ------------------------------------------------------------------------

    async def create_once(
        self, owner: str, body: SessionCreate, key: str, wait: bool = True,
    ) -> tuple[SessionRecord, bool]:
        """:meth:`create` under the client's ``Idempotency-Key``: the session an earlier
        create with that key made (and True), else a new one (and False)."""
        wanted = idempotency_of(key, body)
        record, replayed = await self._creates.create(
            owner, wanted, lambda: self.create(owner, body, wait, wanted))
        if not replayed:
            return record, False
        live = self._live.get(record.id)
        if live is not None:
            record = live.record
            if wait and live.start_task is not None:  # the first create did not wait
                await self._started(live)
        if record.state is S.failed:
            raise not_live(record)  # as the first create answered, or would have
        return record, True

    async def create(
        self, owner: str, body: SessionCreate, wait: bool = True,
        idempotency: Idempotency | None = None,
    ) -> SessionRecord:
        if body.from_snapshot is None:
            return await self._create(owner, body, wait, idempotency=idempotency)
        snapshot = await self.catalog.get(owner, body.from_snapshot)
        directory = self.snapshots.hold(snapshot)
        try:
            if "backend" in body.model_fields_set and body.backend != snapshot.backend:
                raise InvalidRequest(
                    f"snapshot {snapshot.id} is of the {snapshot.backend!r} backend"
                )
            for name in ("display", "browser"):
                if name in body.model_fields_set and getattr(body, name) != getattr(
                    snapshot.body, name
                ):
                    raise InvalidRequest(
                        f"a session made from a snapshot has the snapshot's {name}; leave "
                        f"{name} out"
                    )
            body = body.model_copy(update={
                "backend": snapshot.backend, "display": snapshot.body.display,
                "browser": snapshot.body.browser,
            })
            record = await self._create(owner, body, wait, directory, idempotency=idempotency)
        except BaseException:
            self._release_snapshot(snapshot.id)
            raise
        # Restoring reads the snapshot: it is kept from deletion until the copy runs.
        start_task = self._live[record.id].start_task if record.id in self._live else None
        if start_task is None or start_task.done():
            self._release_snapshot(snapshot.id)
        else:
            start_task.add_done_callback(lambda _: self._release_snapshot(snapshot.id))
        return record

    def _release_snapshot(self, snapshot_id: str) -> None:
        if self.snapshots.release(snapshot_id):
            # Its pool went to 0 while this restore read the images unpacked for it.
            removal = asyncio.create_task(
                asyncio.to_thread(self.snapshots.drop_unwanted, snapshot_id))
            self._removals.add(removal)
            removal.add_done_callback(self._removals.discard)

    async def _create(
        self, owner: str, body: SessionCreate, wait: bool, snapshot: Path | None = None,
        together: StartTogether | None = None, idempotency: Idempotency | None = None,
    ) -> SessionRecord:
        backend_name = body.backend or self._settings.default_backend
        engine = self._engines.get(backend_name)
        if engine is None:
            available = ", ".join(sorted(self._engines)) or "none"
            raise InvalidRequest(
                f"backend {backend_name!r} is not available on this server (available: "
                f"{available})"
            )
        timeout_s = body.timeout_s or self._settings.idle_timeout_s
        if timeout_s > self._settings.max_timeout_s:
            raise InvalidRequest(
                f"timeout_s may be at most {self._settings.max_timeout_s} on this server"
            )
        if body.record:
            if self._fleet is not None:
                raise one_server_only("recording")
            self.recordings.check_quota(owner)
        mounts = body.all_volumes()
        if self._fleet is not None:
            if mounts:
                raise one_server_only("a session with volumes or a browser profile")
            await self._fleet.check_capacity(owner)
        if mounts and snapshot is not None:
            raise InvalidRequest("a session made from a snapshot (or a fork's copy) cannot "
                                 "mount volumes or a browser profile")
        key: PoolKey | SnapshotKey | None = None
        if snapshot is None:
            key = PoolKey.of_body(body, self._settings.default_backend)
        elif body.from_snapshot is not None and body.resources is None and body.network is None:
            key = SnapshotKey(body.from_snapshot, owner, snapshot)  # not a fork's copy
        session_id = new_session_id()
        spec = SessionSpec(
            id=session_id,
            desktop=desktop_spec(body),
            resources=body.resources,
            network=body.network,
            from_snapshot=snapshot,
            runtime_class=body.runtime_class,
            together=together,
            # Disks unknown until attached below: enough for engine.check to refuse volumes.
            volumes=tuple(VolumeAttach(m.name, Path(), m.path, m.read_only) for m in mounts),
        )
        # Before a ready desktop is handed out too: a pooled one honours no more of the body
        # than a cold start would (an engine without egress "none" or runtime classes).
        # Off the event loop: a check may read the snapshot's files (the vm engine's).
        await asyncio.to_thread(engine.check, spec)
        if key is not None and self.pool is not None:
            self.check_capacity(owner)
            claimed = self.pool.claim(key)
            if claimed is not None:
                return await self._adopt_from_pool(owner, body, backend_name, timeout_s,
                                                   *claimed, idempotency)
        if mounts:  # before a profile volume is made for a create that cannot run
            self.check_capacity(owner)
            attached = await self.volumes.attach(
                owner, session_id, mounts,
                [body.browser.profile] if body.browser.profile is not None else [],
            )
            spec = dataclasses.replace(spec, volumes=attached)
        try:
            # No await between the capacity check and taking the slot.
            self.check_capacity(owner)
        except BaseException:
            self.volumes.detach(session_id)
            raise
        record = SessionRecord(
            id=session_id, owner=owner, backend=backend_name, body=body, timeout_s=timeout_s,
            idempotency=idempotency,
        )
        live = LiveSession(record)
        self._live[session_id] = live
        try:
            await self._registry.save(record)
        except BaseException:
            del self._live[session_id]
            self.volumes.detach(session_id)
            raise
        self._publish_state(record)
        live.start_task = asyncio.create_task(self._start(live, engine, spec))
        if wait:
            await self._started(live)
        return record

    async def create_copy(self, owner: str, body: SessionCreate, checkpoint: Path,
                          together: StartTogether) -> SessionRecord:
        """One copy of a fork (copies.py): running, started from ``checkpoint``."""
        return await self._create(owner, body, True, checkpoint, together)

    async def _started(self, live: LiveSession) -> None:
        """Wait for the session's start; SessionFailed if it failed, Conflict if it was
        deleted meanwhile."""
        record, start = live.record, live.start_task
        assert start is not None
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:
            if not start.cancelled():
                raise
            raise Conflict(f"session {record.id} was deleted while it was starting") from None
        if record.state is S.failed:
            reason = record.failure.reason if record.failure else "unknown"
            raise SessionFailed(f"session {record.id} failed to start: {reason}")

    async def _adopt_from_pool(
        self, owner: str, body: SessionCreate, backend_name: str, timeout_s: int,
        session_id: str, handle: AnyDesktop, idempotency: Idempotency | None,
    ) -> SessionRecord:
        """Make a ready pool desktop the caller's session: running at once."""
        record = SessionRecord(
            id=session_id, owner=owner, backend=backend_name, body=body, timeout_s=timeout_s,
            idempotency=idempotency,
        )
        live = LiveSession(record, handle)
        self._live[session_id] = live
        record.transition(S.running)
        record.touch()
        try:
            await self._registry.save(record)
        except BaseException:
            del self._live[session_id]
            await handle.destroy()
            raise
        self._publish_state(record)
        try:
            await handle.claimed()
        except DeskboxError as error:  # a label, not the desktop: the session runs on
            log.warning("session %s: marking its sandbox as claimed: %s", record.id, error)
        self._context.watch(record.id, handle)
        if body.record:
            try:
                await self._context.recordings.begin(record, handle)
            except Exception as error:
                # No room for the recording, or the key's quota used up meanwhile: the
                # caller hears the error and never the session's id, so it must not run
                # on unseen, counted against the key's caps (as _start does).
                reason = (error.message if isinstance(error, DeskboxError)
                          else f"its recording could not begin: {type(error).__name__}")
                await self._end(live, reason)
                raise
        log.info("session %s running (engine %s, from the warm pool)", record.id, backend_name)
        return record

    def check_capacity(self, owner: str, count: int = 1) -> None:
        live = list(self._live.values())
        retry = self._settings.retry_after_s
        if len(live) + count > self._settings.max_sessions:
            raise Capacity(
                f"the server runs its maximum of {self._settings.max_sessions} sessions",
                retry,
            )
        mine = sum(1 for s in live if s.record.owner == owner)
        if mine + count > self._settings.max_sessions_per_key:
            raise Capacity(
                f"this API key has its maximum of {self._settings.max_sessions_per_key} "
                "live sessions; delete one first",
                retry,
            )

    async def _start(self, live: LiveSession, engine: AnyEngine, spec: SessionSpec) -> None:
        try:
            failure = await start_stop.start(
                live, engine, spec, self._context,
                engine.start_timeout(self._settings.start_timeout_s),
                self._settings.desktop_call_timeout_s,
            )
        except Exception as error:
            # Its desktop ran, then its record or its recording could not be written (a
            # full disk, the recordings' quota): the session fails and its desktop goes,
            # rather than leave a start task whose error every delete would raise again.
            log.warning("session %s: after its desktop started: %r", live.record.id, error)
            failure = (error.message if isinstance(error, DeskboxError)
                       else f"the desktop started, then {type(error).__name__}: {error}")
        if failure is not None:
            await self._end(live, failure)

    async def delete(self, owner: str, session_id: str) -> None:
        live = self._live.get(session_id)
        if live is None and self._fleet is not None:
            live = await self._fleet.reach_to_delete(await self.get(owner, session_id))
        if live is None or live.record.owner != owner:
            await self.get(owner, session_id)  # 404 for ids never seen (or not this key's)
            return
        await self._stop(live, None)

    async def keepalive(self, owner: str, session_id: str) -> SessionRecord:
        live = self._live.get(session_id)
        if live is None and self._fleet is not None:
            live = await self._fleet.reach(owner, session_id)
        if live is None or live.record.owner != owner:
            record = await self.get(owner, session_id)
            raise not_live(record)
        if live.record.state not in (S.running, S.paused):
            raise not_live(live.record)
        live.record.touch()
        await self._registry.save(live.record)
        return live.record

    async def _stop(self, live: LiveSession, failure: str | None) -> None:
        start = live.start_task
        if start is not None:
            engine = self._engines.get(live.record.backend)
            if (not start.done() and not start.cancelling() and engine is not None
                    and engine.create_cancellable):
                # A VM's boot under emulation takes minutes: a delete, the reaper or the
                # shutdown ends it now instead of waiting it out (Desktop.start and the
                # engine's create leave nothing of a cancelled start). Once: a second
                # cancel would land in that clean-up and leave the sandbox behind.
                start.cancel()
            try:
                await asyncio.shield(start)
            except asyncio.CancelledError:
                if not start.cancelled():
                    raise  # this caller was cancelled, not the start
        if live.stop_task is None:
            live.stop_task = asyncio.create_task(self._end(live, failure))
        await asyncio.shield(live.stop_task)

    async def _end(self, live: LiveSession, failure: str | None) -> None:
        """Stop (``failure`` None) or fail a session, destroy its desktop (start_stop.py),
        forget it."""
        record = live.record
        try:
            if not await start_stop.end(
                live, self._context, failure,
                self._settings.stop_timeout_s, self._removals,
            ):
                self._unsaved[record.id] = record
        finally:
            with suppress(OSError):
                await asyncio.to_thread(self._frames.forget, record.id)
            self.events.end(record.id)
            if self._live.pop(record.id, None) is not None:
                self._ended[record.state] = self._ended.get(record.state, 0) + 1
                self._remember_ended(record)
        log.info("session %s %s", record.id, record.state.value)

    def _remember_ended(self, record: SessionRecord) -> None:
        """Keep an ended session's record a while: acting on it says why, with no query."""
        self._recent[record.id] = record
        while len(self._recent) > _RECENT:
            self._recent.popitem(last=False)

    def _publish_state(self, record: SessionRecord) -> None:
        reason = record.failure.reason if record.failure and record.state is S.failed else None
        self.events.publish(record.id, "state", state=record.state, reason=reason)

    async def _fail_soon(self, live: LiveSession, reason: str) -> DeskboxError | None:
        """Fail the session; in a fleet, first ask whether another server ended it (its
        desktop is gone because of that): let it go then, and return what to raise."""
        if live.record.state in (S.stopping, S.stopped):
            # Its desktop went because the session was deleted (or stopped idle): a call
            # cut short by that is no failure of the session, which ends stopped.
            return Conflict(f"session {live.record.id} was stopped while the call ran")
        if live.stop_task is None and self._fleet is not None:
            ended = await self._fleet.ended_elsewhere(live.record.id)
            if ended is not None:
                if live.stop_task is None:
                    await self.hand_over(live, ended)
                return not_live(ended)
        if live.stop_task is None:
            live.stop_task = asyncio.create_task(self._end(live, reason))
            # Let it take its first step, the state change: the caller's error and a GET
            # right after it then both say failed.
            await asyncio.sleep(0)
        return None

    # -- the reaper -----------------------------------------------------------------------

    async def reap(self) -> None:
        """One pass: fail sessions whose desktop died, stop those idle past their timeout;
        save the ends the registry could not take before."""
        await self._save_unsaved()
        if self.pool is not None:
            self.pool.check()
        grace = dt.timedelta(0)
        if self._fleet is not None:
            try:
                await self._fleet.reconcile()
            except DeskboxError as error:  # the fleet's records unreachable: reap ours
                log.warning("keeping in step with the fleet: %s", error.message)
            grace = self._fleet.clock_grace
        now = utcnow()
        for live in list(self._live.values()):
            record = live.record
            if record.state not in (S.running, S.paused, S.hibernated) or live.handle is None:
                continue
            if live.stop_task or live.changing.locked():
                continue
            # A hibernated desktop runs no process that could have failed. A stalled desktop
            # (a call that did not return in time) counts as failed (Desktop.failure).
            reason = None
            if record.state is not S.hibernated:
                reason = live.handle.failure()
                self._note_held(live, live.handle)
            if reason is not None:
                await self._fail_soon(live, f"the desktop failed: {reason}")
            elif live.handoff is not None and live.handoff.in_use:
                record.touch()  # its idle time counts from the hand-back
            elif live.busy == 0 and record.expired(now - grace):
                log.info("session %s idle for %d s: stopping it", record.id, record.timeout_s)
                self.stop_soon(live)

    def _note_held(self, live: LiveSession, handle: AnyDesktop) -> None:
        """A sandbox someone else paused (a ``docker pause``, a ``runc pause``): the calls
        waiting on it are answered (409) rather than at their deadline, and the event stream
        says when it was paused and let go."""
        held = handle.held()
        if held is not None:
            handle.end_calls()
        if (held is None) != (live.held is None):
            if held is not None:
                self.events.publish(live.record.id, "sandbox_held", reason=held)
            else:
                self.events.publish(live.record.id, "sandbox_released")
        live.held = held

    async def _reap_forever(self) -> None:
        forgotten_at = -_FORGET_EVERY_S  # the first pass forgets too
        while True:
            await asyncio.sleep(self._settings.reaper_interval_s)
            try:
                await self.reap()
                await asyncio.to_thread(self.recordings.store.sweep)
                if time.monotonic() - forgotten_at >= _FORGET_EVERY_S:
                    forgotten_at = time.monotonic()
                    await self.forget_ended()
            except Exception:
                log.exception("reaper pass failed")

    async def _save_unsaved(self) -> None:
        """Save the ends the registry could not take before (a full or failing disk)."""
        for record in list(self._unsaved.values()):
            try:
                await self._registry.save(record)
            except InsufficientStorage:
                return  # still refused
            self._unsaved.pop(record.id, None)

    async def forget_ended(self) -> None:
        """Delete the records of sessions that ended over ``ended_session_ttl_h`` ago."""
        ttl = dt.timedelta(hours=self._settings.ended_session_ttl_h)
        if forgotten := await self._registry.forget_ended(utcnow() - ttl):
            log.info("forgot %d sessions that ended over %g h ago", forgotten,
                     self._settings.ended_session_ttl_h)

