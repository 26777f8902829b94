"""Sessions: create, find, act on, keep alive and stop them; caps; idle expiry.

The manager owns the live sessions of this process (their backend handles) and keeps the
registry in step with every state change. Requests reach it already parsed; it raises only
``DeskboxError`` subclasses.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

from ..backends.base import Backend, DesktopHandle, SessionSpec
from ..driver.commands import DesktopSpec
from ..driver.desktop import BatchResult
from ..driver.images import EncodedImage
from ..errors import (
    Capacity,
    Conflict,
    DeskboxError,
    Internal,
    InvalidRequest,
    NotFound,
    SessionFailed,
)
from ..metrics import Metrics
from ..schemas import actions as a
from ..schemas.sessions import Failure, SessionCreate, SessionState
from ..settings import Settings
from .browser_watch import BrowserWatch
from .events import EventLog
from .lifecycle import LIVE_STATES, SessionRecord, utcnow
from .links import SessionLinks
from .live import LiveSession, not_live
from .pause import FrameStore
from .pool import PoolKey, SnapshotKey, WarmPool, new_session_id
from .registry import Registry
from .snapshots import SnapshotStore
from .state_changes import StateChanges

__all__ = ["LiveSession", "SessionManager"]

log = logging.getLogger("deskbox.sessions")
_RECENT = 1024
S = SessionState


class SessionManager(StateChanges):
    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        backends: Mapping[str, Backend],
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._registry = registry
        self._backends = dict(backends)
        self._metrics = metrics
        self._live: dict[str, LiveSession] = {}
        self._ended: dict[SessionState, int] = {}
        # Sessions that ended lately, so that acting on one says why without a query.
        self._recent: OrderedDict[str, SessionRecord] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        # Removals of desktops that outlasted stop_timeout_s: they go on in the background.
        self._removals: set[asyncio.Task[None]] = set()
        self._lock_fd: int | None = None
        # GET /v1/sessions/{id}/events: state changes, browser exits and restarts.
        self.events = EventLog()
        self._browsers = BrowserWatch(self.events)
        # VNC viewers and DevTools sockets, closed before a checkpoint (links.py).
        self.links = SessionLinks()
        self.snapshots = SnapshotStore(settings.state_dir / "snapshots")
        self._frames = FrameStore(settings.state_dir / "frames")
        pool_backend = self._backends.get(settings.default_backend)
        self.pool = WarmPool(
            pool_backend, [PoolKey.parse(d) for d in settings.pool_displays],
            settings.pool_size, settings.start_timeout_s,
        ) if pool_backend is not None else None

    # -- server lifetime ------------------------------------------------------------------

    async def start(self) -> None:
        """Prepare the backends (may build the session image), then recover what a previous
        server left: running sessions whose desktop still runs are re-adopted, the other
        live ones are marked failed, and sandboxes the registry does not know are removed.
        """
        self._lock_fd = await asyncio.to_thread(_lock_state_dir, self._settings.state_dir)
        try:
            await self._recover()
        except BaseException:
            for live in self._live.values():  # re-adopted: let go, leave the desktop running
                await self._browsers.stop(live.record.id)
                if live.handle is not None:
                    live.handle.worker.shutdown()
            self._live.clear()
            await self._registry.close()
            os.close(self._lock_fd)
            self._lock_fd = None
            raise
        self._reaper = asyncio.create_task(self._reap_forever(), name="deskbox-reaper")
        if self.pool is not None:
            for snapshot in await asyncio.to_thread(self.snapshots.all):
                if snapshot.pool_size:
                    await self.pool.set_target(self._pool_key(snapshot), snapshot.pool_size)
            self.pool.start()

    async def _recover(self) -> None:
        await self._registry.open()
        await asyncio.to_thread(self.snapshots.open)
        await asyncio.to_thread(self._frames.open)
        for backend in self._backends.values():
            await backend.prepare()
        # This process holds no desktop yet: what the registry calls live was left by a
        # previous server.
        adopted: dict[str, set[str]] = {name: set() for name in self._backends}
        for record in await self._registry.live():
            reason = await self._adopt(record)
            if reason is None:
                adopted[record.backend].add(record.id)
                continue
            log.warning("session %s failed: %s", record.id, reason)
            await self._registry.save(_failed(record, reason))
        for name, backend in self._backends.items():
            removed = await backend.remove_orphans(adopted[name])
            if removed:
                log.info("removed %d orphaned %s sandboxes: %s", len(removed), name,
                         ", ".join(removed))
        self._ended = {
            state: count
            for state, count in (await self._registry.count_by_state()).items()
            if state not in LIVE_STATES
        }

    async def _adopt(self, record: SessionRecord) -> str | None:
        """Re-adopt a session a previous server left running; None, or why it failed."""
        backend = self._backends.get(record.backend)
        if backend is None:
            return f"the server restarted without the {record.backend!r} backend"
        if record.state not in (S.running, S.hibernated):
            return f"the server restarted while the session was {record.state.value}"
        spec = SessionSpec(id=record.id, desktop=_desktop_spec(record.body))
        last_frame = None
        try:
            if record.state is S.hibernated:
                handle = await backend.adopt_hibernated(spec)
                last_frame = await asyncio.to_thread(self._frames.load, record.id)
            else:
                handle = await backend.adopt(spec)
        except DeskboxError as error:
            return f"the server restarted and could not re-adopt it: {error.message}"
        except Exception as error:
            log.exception("re-adopting session %s", record.id)
            return f"the server restarted and could not re-adopt it: {type(error).__name__}"
        self._live[record.id] = LiveSession(record, handle, last_frame=last_frame)
        if record.state is S.running:
            self._browsers.start(record.id, handle)
        log.info("session %s re-adopted (backend %s, %s)", record.id, record.backend,
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
        # Hibernated sessions stay on disk for the next server; the others stop.
        await asyncio.gather(
            *(self._stop(live, None) if live.record.state is not S.hibernated
              else self._let_go(live) for live in list(self._live.values())),
            return_exceptions=True,
        )
        if self._removals:  # a last chance, bounded, for removals that overran
            await asyncio.wait(self._removals, timeout=self._settings.stop_timeout_s)
        for backend in self._backends.values():
            with suppress(Exception):
                await backend.close()
        await self._registry.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the state dir's lock
            self._lock_fd = None

    async def _let_go(self, live: LiveSession) -> None:
        async with live.changing:  # not while a resume restores it
            if live.record.state is S.hibernated and live.stop_task is None:
                self._live.pop(live.record.id, None)
                if live.handle is not None:
                    try:
                        await self._backends[live.record.backend].release(live.handle)
                    except Exception:
                        log.exception("releasing hibernated session %s", live.record.id)
                log.info("session %s stays hibernated for the next server", live.record.id)
                return
        await self._stop(live, None)

    # -- queries --------------------------------------------------------------------------

    def counts_by_state(self) -> dict[str, int]:
        counts = {state.value: 0 for state in S}
        for state, count in self._ended.items():
            counts[state.value] += count
        for live in self._live.values():
            counts[live.record.state.value] += 1
        return counts

    async def get(self, owner: str, session_id: str) -> SessionRecord:
        live = self._live.get(session_id)
        if live is not None and live.record.owner == owner:
            return live.record
        record = await self._registry.get(session_id)
        if record is None or record.owner != owner:
            raise NotFound(f"no session {session_id!r}")
        return record

    async def list(
        self, owner: str, state: SessionState | None = None, labels: Mapping[str, str] = {}
    ) -> list[SessionRecord]:
        records = await self._registry.owned(owner)
        merged = [
            self._live[r.id].record if r.id in self._live else r for r in records
        ]
        return [r for r in merged if r.matches(state, dict(labels))]

    def handle(self, owner: str, session_id: str) -> DesktopHandle:
        """The desktop of a running session of ``owner`` (for tests and proxies)."""
        return self._running(owner, session_id)[1]

    # -- lifecycle ------------------------------------------------------------------------

    async def create(self, owner: str, body: SessionCreate, wait: bool = True) -> SessionRecord:
        if body.from_snapshot is None:
            return await self._create(owner, body, wait)
        snapshot, directory = self.snapshots.acquire(owner, body.from_snapshot)
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
            record = await self._create(owner, body, wait, directory)
        except BaseException:
            self.snapshots.release(snapshot.id)
            raise
        # Restoring reads the snapshot: it is kept from deletion until the copy runs.
        start_task = self._live[record.id].start_task if record.id in self._live else None
        if start_task is None or start_task.done():
            self.snapshots.release(snapshot.id)
        else:
            start_task.add_done_callback(lambda _: self.snapshots.release(snapshot.id))
        return record

    async def _create(
        self, owner: str, body: SessionCreate, wait: bool, snapshot: Path | None = None
    ) -> SessionRecord:
        backend_name = body.backend or self._settings.default_backend
        backend = self._backends.get(backend_name)
        if backend is None:
            available = ", ".join(sorted(self._backends)) or "none"
            raise InvalidRequest(
                f"backend {backend_name!r} is not available on this server (available: "
                f"{available})"
            )
        timeout_s = body.timeout_s or self._settings.idle_timeout_s
        if timeout_s > self._settings.max_timeout_s:
            raise InvalidRequest(
                f"timeout_s may be at most {self._settings.max_timeout_s} on this server"
            )
        key: PoolKey | SnapshotKey | None = None
        if snapshot is None:
            key = PoolKey.of_body(body, self._settings.default_backend)
        elif body.from_snapshot is not None and body.resources is None and body.network is None:
            key = SnapshotKey(body.from_snapshot, owner, snapshot)  # not a fork's copy
        if key is not None and self.pool is not None:
            self._check_capacity(owner)
            claimed = self.pool.claim(key)
            if claimed is not None:
                return await self._adopt_from_pool(owner, body, backend_name, timeout_s,
                                                   *claimed)
        session_id = new_session_id()
        spec = SessionSpec(
            id=session_id,
            desktop=_desktop_spec(body),
            resources=body.resources,
            network=body.network,
            from_snapshot=snapshot,
            record=body.record,
        )
        backend.check(spec)
        # No await between the capacity check and taking the slot.
        self._check_capacity(owner)
        record = SessionRecord(
            id=session_id, owner=owner, backend=backend_name, body=body, timeout_s=timeout_s
        )
        live = LiveSession(record)
        self._live[session_id] = live
        try:
            await self._registry.save(record)
        except BaseException:
            del self._live[session_id]
            raise
        self._publish_state(record)
        live.start_task = asyncio.create_task(self._start(live, backend, spec))
        if wait:
            await asyncio.shield(live.start_task)
            if record.state is S.failed:
                reason = record.failure.reason if record.failure else "unknown"
                raise SessionFailed(f"session {session_id} failed to start: {reason}")
        return record

    async def _adopt_from_pool(
        self, owner: str, body: SessionCreate, backend_name: str, timeout_s: int,
        session_id: str, handle: DesktopHandle,
    ) -> SessionRecord:
        """Make a ready pool desktop the caller's session: running at once."""
        record = SessionRecord(
            id=session_id, owner=owner, backend=backend_name, body=body, timeout_s=timeout_s
        )
        live = LiveSession(record, handle)
        self._live[session_id] = live
        record.transition(S.running)
        record.touch()
        try:
            await self._registry.save(record)
        except BaseException:
            del self._live[session_id]
            await self._backends[backend_name].destroy(handle)
            raise
        self._publish_state(record)
        self._browsers.start(record.id, handle)
        log.info("session %s running (backend %s, from the warm pool)", record.id, backend_name)
        return record

    def _check_capacity(self, owner: str, count: int = 1) -> None:
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

    async def _start(self, live: LiveSession, backend: Backend, spec: SessionSpec) -> None:
        record = live.record
        started = time.monotonic()
        try:
            handle = await backend.create(spec, self._settings.start_timeout_s)
        except DeskboxError as error:
            await self._end(live, error.message)
            return
        except Exception as error:
            log.exception("session %s failed to start", record.id)
            await self._end(live, f"the desktop did not start: {type(error).__name__}")
            return
        live.handle = handle
        if record.state is not S.starting:  # failed or being stopped meanwhile
            return
        record.transition(S.running)
        record.touch()
        await self._registry.save(record)
        self._publish_state(record)
        self._browsers.start(record.id, handle)
        log.info(
            "session %s running (backend %s, %.2f s)",
            record.id, record.backend, time.monotonic() - started,
        )

    async def delete(self, owner: str, session_id: str) -> None:
        live = self._live.get(session_id)
        if live is None or live.record.owner != owner:
            await self.get(owner, session_id)  # 404 for ids never seen (or not this key's)
            return
        await self._stop(live, None)

    async def keepalive(self, owner: str, session_id: str) -> SessionRecord:
        live = self._live.get(session_id)
        if live is None or live.record.owner != owner:
            record = await self.get(owner, session_id)
            raise not_live(record)
        if live.record.state not in (S.running, S.paused):
            raise not_live(live.record)
        live.record.touch()
        await self._registry.save(live.record)
        return live.record

    async def _stop(self, live: LiveSession, failure: str | None) -> None:
        if live.start_task is not None:
            await asyncio.shield(live.start_task)
        if live.stop_task is None:
            live.stop_task = asyncio.create_task(self._end(live, failure))
        await asyncio.shield(live.stop_task)

    async def _end(self, live: LiveSession, failure: str | None) -> None:
        """Stop (``failure`` None) or fail a session, destroy its desktop, forget it.

        Bounded: a desktop not removed within stop_timeout_s leaves the session failed (its
        removal goes on in the background), never stuck in ``stopping``.
        """
        record = live.record
        try:
            # The state changes first, with no await before it: callers see it at once.
            if record.state in LIVE_STATES and record.state is not S.stopping:
                if failure is None:
                    record.transition(S.stopping)
                else:
                    record.transition(S.failed, failure)
                    log.warning("session %s failed: %s", record.id, failure)
                await self._registry.save(record)
                self._publish_state(record)
            await self._browsers.stop(record.id)  # before the browser goes with the desktop
            if live.handle is not None and not await self._remove(live):
                reason = (f"the desktop was not removed within "
                          f"{self._settings.stop_timeout_s:g} s; its removal goes on")
                log.error("session %s: %s", record.id, reason)
                if record.state is S.stopping:
                    record.transition(S.failed, reason)
                    await self._registry.save(record)
                    self._publish_state(record)
            if record.state is S.stopping:
                record.transition(S.stopped)
                await self._registry.save(record)
                self._publish_state(record)
        finally:
            with suppress(OSError):
                await asyncio.to_thread(self._frames.forget, record.id)
            self.events.end(record.id)
            if self._live.pop(record.id, None) is not None:
                self._ended[record.state] = self._ended.get(record.state, 0) + 1
                self._recent[record.id] = record
                while len(self._recent) > _RECENT:
                    self._recent.popitem(last=False)
        log.info("session %s %s", record.id, record.state.value)

    async def _remove(self, live: LiveSession) -> bool:
        """Destroy the session's desktop; False if that took more than stop_timeout_s (it
        goes on in the background, and shutdown gives it one more bounded wait)."""
        assert live.handle is not None
        backend = self._backends[live.record.backend]
        removal = asyncio.create_task(self._destroy(backend, live.handle, live.record.id))
        done, _ = await asyncio.wait({removal}, timeout=self._settings.stop_timeout_s)
        if done:
            return True
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)
        return False

    @staticmethod
    async def _destroy(backend: Backend, handle: DesktopHandle, session_id: str) -> None:
        try:
            await backend.destroy(handle)
        except Exception:
            log.exception("destroying session %s", session_id)

    def _owned(self, owner: str, session_id: str) -> LiveSession:
        live = self._live.get(session_id)
        if live is None or live.record.owner != owner:
            ended = self._recent.get(session_id)
            if ended is not None and ended.owner == owner:
                raise not_live(ended)
            raise NotFound(f"no live session {session_id!r}")
        return live

    # -- actions --------------------------------------------------------------------------

    def _running(self, owner: str, session_id: str) -> tuple[LiveSession, DesktopHandle]:
        live = self._live.get(session_id)
        if live is None or live.record.owner != owner:
            ended = self._recent.get(session_id)
            if ended is not None and ended.owner == owner:
                raise not_live(ended)
            raise NotFound(f"no running session {session_id!r}")
        if live.record.state is not S.running or live.handle is None:
            raise not_live(live.record)
        if live.checkpointing:
            raise Conflict(
                f"session {session_id} is being checkpointed (snapshot or fork); try again "
                "in a moment"
            )
        return live, live.handle

    async def run(
        self,
        owner: str,
        session_id: str,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        # Everything up to the worker call is synchronous: calls reach the desktop's worker
        # in the order they arrive (the websocket relies on it).
        live, handle = self._running(owner, session_id)
        view = view or live.record.body.coordinate_space
        kind = actions[0].type if actions else "none"
        live.busy += 1
        started = time.perf_counter()
        try:
            result = await handle.run(actions, view, screenshot)
        except SessionFailed as error:
            self._metrics.actions.inc(kind, "error", amount=len(actions) or 1)
            await self._fail_soon(live, error.message)
            raise
        except DeskboxError:
            self._metrics.actions.inc(kind, "error")
            raise
        finally:
            live.busy -= 1
            if live.record.state is S.running:
                live.record.touch()
        self._metrics.action_seconds.observe(time.perf_counter() - started, kind)
        for action in actions:
            self._metrics.actions.inc(action.type, "ok")
            if isinstance(action, a.Screenshot | a.Zoom):
                self._metrics.screenshots.inc(action.format)
        if screenshot is not None:
            self._metrics.screenshots.inc(screenshot.format)
        return result

    async def capture(
        self,
        owner: str,
        session_id: str,
        fmt: Literal["jpeg", "png", "webp"],
        quality: int,
        scale: a.ScaleTo | None = None,
    ) -> EncodedImage:
        shot = a.Screenshot(format=fmt, quality=quality, scale=scale)
        image = (await self.run(owner, session_id, [shot])).results[0]
        assert isinstance(image, EncodedImage)
        return image

    @asynccontextmanager
    async def using(self, owner: str, session_id: str) -> AsyncIterator[DesktopHandle]:
        """The handle of a running session, marked busy (never reaped) while in use.

        For exec and files (api/exec.py); a SessionFailed raised inside fails the session.
        """
        live, handle = self._running(owner, session_id)
        live.busy += 1
        try:
            yield handle
        except SessionFailed as error:
            await self._fail_soon(live, error.message)
            raise
        finally:
            live.busy -= 1
            if live.record.state is S.running:
                live.record.touch()

    def touch(self, owner: str, session_id: str) -> None:
        """Note use of a running session that goes around ``run`` (CDP traffic): the reaper
        counts its idle time from now."""
        self._running(owner, session_id)[0].record.touch()

    def _publish_state(self, record: SessionRecord) -> None:
        reason = record.failure.reason if record.failure and record.state is S.failed else None
        self.events.publish(record.id, "state", state=record.state, reason=reason)

    async def _fail_soon(self, live: LiveSession, reason: str) -> None:
        if live.stop_task is None:
            live.stop_task = asyncio.create_task(self._end(live, reason))
            # Let it take its first step, the state change: the caller's error and a GET
            # right after it then both say failed.
            await asyncio.sleep(0)

    # -- the reaper -----------------------------------------------------------------------

    async def reap(self) -> None:
        """One pass: fail sessions whose desktop died, stop those idle past their timeout."""
        if self.pool is not None:
            self.pool.check()
        now = utcnow()
        for live in list(self._live.values()):
            record = live.record
            if record.state not in (S.running, S.paused, S.hibernated) or live.handle is None:
                continue
            if live.stop_task or live.changing.locked():
                continue
            # A hibernated desktop runs no process that could have failed. A stalled worker
            # (a call that did not return in time) means an X server that does not answer.
            reason = None
            if record.state is not S.hibernated:
                reason = live.handle.failure() or live.handle.worker.stalled
            if reason is not None:
                await self._fail_soon(live, f"the desktop failed: {reason}")
            elif live.busy == 0 and record.expired(now):
                log.info("session %s idle for %d s: stopping it", record.id, record.timeout_s)
                live.stop_task = asyncio.create_task(self._end(live, None))

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.reaper_interval_s)
            try:
                await self.reap()
            except Exception:
                log.exception("reaper pass failed")


def _lock_state_dir(state_dir: Path) -> int:
    """Hold ``state_dir/server.lock`` while we serve: one server per state dir.

    A second server would re-adopt (and at its shutdown destroy) the first one's sessions.
    """
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(state_dir / "server.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Internal(f"another Deskbox server is using the state dir {state_dir}") from None
    return fd


def _desktop_spec(body: SessionCreate) -> DesktopSpec:
    return DesktopSpec(
        width=body.display.width,
        height=body.display.height,
        dpi=body.display.dpi,
        start_url=body.browser.start_url,
    )


def _failed(record: SessionRecord, reason: str) -> SessionRecord:
    record.state = S.failed
    record.failure = Failure(reason=reason, at=utcnow())
    record.expires_at = None
    return record
