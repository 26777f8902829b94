"""The warm pool: desktops started ahead of demand, so that ``create`` takes one at once.

The pool keeps ``pool_size`` ready desktops of the default backend per display size of
``pool_displays``, each on ``about:blank`` with the default resources and no network (the
API's defaults). A create whose body asks for nothing else (any labels and timeout; no
start_url, resources, network, snapshot or recording) takes one (:meth:`WarmPool.claim`):
the session manager makes it a session of the caller, and the pool starts a replacement.

- Pool desktops belong to nobody: they are in no registry and no listing, and a claimed
  one is never given back, so no state passes from one user to another.
- Refills run one at a time, in the background, and start their sandbox at its normal CPU
  quota (no start-up boost), so that they do not starve the sessions that run.
- A pool desktop that dies is dropped and replaced; at shutdown the pool destroys its
  desktops, and a server that died leaves them to the orphan removal of the next one.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ..engines import AnyEngine, SessionSpec
from ..engines.desktop_commands import DesktopSpec
from ..errors import InvalidSetting
from ..schemas.sessions import Browser, Display, SessionCreate
from .desktop import DEFAULT_CALL_TIMEOUT_S, AnyDesktop, Desktop

__all__ = ["PoolKey", "SnapshotKey", "WarmPool", "new_session_id"]

log = logging.getLogger("deskbox.pool")
_RETRY_AFTER_FAILURE_S = 5.0


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(10)


@dataclass(frozen=True)
class PoolKey:
    width: int
    height: int
    dpi: int

    @classmethod
    def parse(cls, text: str, dpi: int = 96) -> PoolKey:
        """A size of DESKBOX_POOL_DISPLAYS; InvalidSetting for one no create may ask for
        (the pool tried to start it every few seconds for ever: Xvfb died on 0x0)."""
        width, _, height = text.partition("x")
        try:
            Display(width=int(width), height=int(height), dpi=dpi)
        except ValidationError as error:
            why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            raise InvalidSetting(f"DESKBOX_POOL_DISPLAYS: {text} is no display a session may "
                                 f"have ({why})") from None
        return cls(int(width), int(height), dpi)

    @classmethod
    def of_body(cls, body: SessionCreate, default_backend: str) -> PoolKey | None:
        """The pool a create body can be served from, or None (it needs a cold start)."""
        plain = (
            (body.backend is None or body.backend == default_backend)
            and body.browser == Browser()
            and body.from_snapshot is None
            and body.resources is None
            and (body.network is None or body.network.egress == "none")
            and body.runtime_class is None
            and not body.volumes  # a pooled desktop has no volume mounted
        )
        if not plain:
            return None
        return cls(body.display.width, body.display.height, body.display.dpi)

    def spec(self, session_id: str) -> SessionSpec:
        return SessionSpec(
            id=session_id,
            desktop=DesktopSpec(width=self.width, height=self.height, dpi=self.dpi,
                                start_url=Browser().start_url),
            background=True,
        )

    @property
    def display(self) -> Display:
        return Display(width=self.width, height=self.height, dpi=self.dpi)

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass(frozen=True)
class SnapshotKey:
    """Ready copies of one snapshot, for its owner's creates ``from_snapshot``."""

    snapshot_id: str
    owner: str
    directory: Path

    def spec(self, session_id: str) -> SessionSpec:
        return SessionSpec(id=session_id, desktop=DesktopSpec(), from_snapshot=self.directory,
                           background=True)

    @property
    def label(self) -> str:
        return self.snapshot_id


@dataclass
class _Ready:
    session_id: str
    handle: AnyDesktop


Key = PoolKey | SnapshotKey


class WarmPool:
    def __init__(
        self, engine: AnyEngine, keys: Iterable[PoolKey], size: int, start_timeout_s: float,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> None:
        self._engine = engine
        self._call_timeout_s = call_timeout_s
        self._timeout_s = start_timeout_s
        # How many ready desktops each pool keeps; snapshot pools come and go at run time.
        self._targets: dict[Key, int] = {key: size for key in keys} if size else {}
        self._ready: dict[Key, deque[_Ready]] = {key: deque() for key in self._targets}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        # When a pool whose last start failed is tried again: until then the others refill
        # (a snapshot that never restores once held the loop, and every other pool ran dry).
        self._retry_at: dict[Key, float] = {}
        self._starting: asyncio.Future[AnyDesktop] | None = None  # the refill's start
        self._starting_key: Key | None = None  # and the pool it is for
        self.claimed = 0

    @property
    def backend(self) -> str:
        """The engine the pool's desktops run on: a snapshot of another cannot be pooled."""
        return self._engine.name

    def ready(self, key: Key) -> int:
        return len(self._ready.get(key, ()))

    def target(self, key: Key) -> int:
        return self._targets.get(key, 0)

    def ready_by_display(self) -> dict[str, int]:
        """Ready desktops per ``WIDTHxHEIGHT`` or snapshot id (``deskbox_pool_ready``)."""
        return {key.label: len(queue) for key, queue in self._ready.items()}

    def snapshot_keys(self, owner: str) -> list[SnapshotKey]:
        return [k for k in self._targets if isinstance(k, SnapshotKey) and k.owner == owner]

    async def set_target(self, key: SnapshotKey, size: int) -> None:
        """Keep ``size`` ready copies of a snapshot (0: none; the ready ones are destroyed)."""
        if size:
            self._targets[key] = size
            self._ready.setdefault(key, deque())
        else:
            self._targets.pop(key, None)
            self._retry_at.pop(key, None)
        queue = self._ready.get(key, deque())
        surplus = [queue.pop() for _ in range(max(0, len(queue) - size))]
        if not size:
            self._ready.pop(key, None)
        self._wake.set()
        await asyncio.gather(*(self._discard(r, "no longer wanted") for r in surplus))

    async def settled(self, key: Key) -> None:
        """Once the refill starts no desktop of ``key`` (a copy of a snapshot being restored
        reads its images until then). For a pool already dropped: none starts after."""
        starting = self._starting
        if starting is not None and self._starting_key == key:
            await asyncio.wait([starting])

    def start(self) -> None:
        self._task = asyncio.create_task(self._refill_forever(), name="deskbox-pool")

    def claim(self, key: Key | None) -> tuple[str, AnyDesktop] | None:
        """A ready desktop for ``key`` (its session id and handle), or None. Synchronous:
        no other create can take the same one."""
        queue = self._ready.get(key) if key is not None else None
        while queue:
            ready = queue.popleft()
            self._wake.set()
            if ready.handle.failure() is None:
                self.claimed += 1
                return ready.session_id, ready.handle
            asyncio.create_task(self._discard(ready, "it died while waiting"))
        return None

    def check(self) -> None:
        """Drop ready desktops that died (the reaper calls this)."""
        for queue in self._ready.values():
            for ready in [r for r in queue if r.handle.failure() is not None]:
                queue.remove(ready)
                self._wake.set()
                asyncio.create_task(self._discard(ready, ready.handle.failure() or "died"))

    async def _discard(self, ready: _Ready, why: str) -> None:
        log.info("pool desktop %s dropped: %s", ready.session_id, why)
        with suppress(Exception):
            await ready.handle.destroy()

    async def _refill_forever(self) -> None:
        while not self._closing:
            # Cleared before the pass, not after: a claim or a close() during a start sets
            # it again, and the wait below returns at once instead of missing that wake.
            self._wake.clear()
            loop = asyncio.get_running_loop()
            for key in list(self._targets):
                if self._retry_at.get(key, 0.0) > loop.time():
                    continue
                self._retry_at.pop(key, None)
                while (not self._closing and key in self._targets
                       and len(self._ready[key]) < self._targets[key]):
                    session_id = new_session_id()
                    self._starting_key = key
                    starting = self._starting = asyncio.ensure_future(Desktop.start(
                        self._engine, key.spec(session_id), self._timeout_s,
                        self._call_timeout_s,
                    ))
                    try:
                        handle = await starting
                    except asyncio.CancelledError:
                        if self._closing and starting.cancelled():
                            return  # close() cancelled the start (it cleaned up after itself)
                        raise
                    except Exception as error:
                        if key not in self._targets:
                            # Dropped meanwhile: a deleted snapshot's images vanish under
                            # the restore, which then fails as it should. Nothing is wrong.
                            log.info("pool %s: dropped while a desktop started (%s)",
                                     key.label, getattr(error, "message", repr(error)))
                            continue
                        log.warning("pool: starting a desktop for %s failed: %s", key.label,
                                    getattr(error, "message", repr(error)))
                        self._retry_at[key] = loop.time() + _RETRY_AFTER_FAILURE_S
                        break
                    finally:
                        self._starting = None
                    try:
                        # An empty batch: the agent forgets the screen changes of the start
                        # (or the restore), so the first look after a claim answers at once
                        # instead of waiting out a quiet window of its own.
                        await handle.desktop.run([])
                    except Exception as error:
                        await self._discard(_Ready(session_id, handle),
                                            getattr(error, "message", repr(error)))
                        if key in self._targets:
                            # As after a failed start: one whose desktops all failed here
                            # was started again at once, for ever, and no other pool refilled.
                            self._retry_at[key] = loop.time() + _RETRY_AFTER_FAILURE_S
                        break
                    # Checked after the last await: a pool dropped during the start or the
                    # empty batch has no queue any more (a KeyError here once ended the
                    # refills for good, and the server's shutdown with them).
                    if key not in self._targets:
                        await self._discard(_Ready(session_id, handle), "pool dropped")
                        continue
                    queue = self._ready[key]
                    queue.append(_Ready(session_id, handle))
                    log.info("pool %s: desktop %s ready (%d of %d)", key.label, session_id,
                             len(queue), self._targets[key])
            retries = [at for key, at in self._retry_at.items() if key in self._targets]
            if not retries:
                await self._wake.wait()
                continue
            with suppress(TimeoutError):
                async with asyncio.timeout_at(min(retries)):
                    await self._wake.wait()

    async def close(self) -> None:
        """Stop refilling and destroy the ready desktops. A desktop being started is
        cancelled where the engine's create allows it, else let finish (runc's start runs in
        a thread) and destroyed too. Only the start is cancelled, never the refill itself:
        a desktop started and not yet queued (its empty batch, its discard) was left
        running when the refill was cancelled there."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            if self._engine.create_cancellable and self._starting is not None:
                self._starting.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self._timeout_s + 10)
            except TimeoutError:
                self._task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._task
        ready = [r for queue in self._ready.values() for r in queue]
        for queue in self._ready.values():
            queue.clear()
        await asyncio.gather(*(r.handle.destroy() for r in ready),
                             return_exceptions=True)
