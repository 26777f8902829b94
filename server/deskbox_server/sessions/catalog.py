"""The snapshots a caller sees: finding, listing and deleting them, and their pools.

Made snapshots come from ``SessionCopies.snapshot`` (copies.py: a running session's
checkpoint); this catalog keeps the rest of their life: the store on disk (snapshots.py)
and the warm pool's ready copies of each (pool.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from ..engines import AnyEngine
from ..errors import InvalidRequest
from .pool import SnapshotKey, WarmPool
from .snapshots import SnapshotRecord, SnapshotStore

__all__ = ["SnapshotCatalog"]


class SnapshotCatalog:
    def __init__(self, store: SnapshotStore, pool: WarmPool | None, cap_per_key: int,
                 engines: Mapping[str, AnyEngine]) -> None:
        self._store = store
        self._pool = pool
        self._cap_per_key = cap_per_key
        self._engines = engines
        # Per API key (there are few): a pool's size, or a snapshot's delete.
        self._setting_pools: dict[str, asyncio.Lock] = {}

    async def get(self, owner: str, snapshot_id: str) -> SnapshotRecord:
        return await asyncio.to_thread(self._store.get, owner, snapshot_id)

    async def list(self, owner: str) -> list[SnapshotRecord]:
        return await asyncio.to_thread(self._store.list, owner)

    async def delete(self, owner: str, snapshot_id: str) -> None:
        # Not beside a change of a pool: one set during the delete came back as a pool of
        # a snapshot that was gone, restoring and failing for ever.
        async with self._setting_pools.setdefault(owner, asyncio.Lock()):
            await self._delete(owner, snapshot_id)

    async def _delete(self, owner: str, snapshot_id: str) -> None:
        # Refused (409: a create restores from it) before its pool is touched: the pool's
        # ready copies were once destroyed first, then the delete refused.
        snapshot = await asyncio.to_thread(self._store.begin_delete, owner, snapshot_id)
        try:
            if self._pool is not None:
                # The copies go before the files: a refill restoring from them reads them.
                await self._pool.set_target(self.pool_key(snapshot), 0)
            await asyncio.to_thread(self._store.finish_delete, snapshot_id)
        except BaseException as error:
            self._store.cancel_delete(snapshot_id)
            if isinstance(error, Exception) and self._pool is not None and snapshot.pool_size:
                # Failed: it stays, and so does its pool.
                await self._pool.set_target(self.pool_key(snapshot), snapshot.pool_size)
            raise

    def pool_ready(self, snapshot: SnapshotRecord) -> int:
        return self._pool.ready(self.pool_key(snapshot)) if self._pool is not None else 0

    def pool_key(self, snapshot: SnapshotRecord) -> SnapshotKey:
        return SnapshotKey(snapshot.id, snapshot.owner, self._store.directory(snapshot.id))

    async def set_pool(self, owner: str, snapshot_id: str, size: int) -> SnapshotRecord:
        """Keep ``size`` ready copies of a snapshot for its owner's creates from it.

        The copies of all of a key's snapshots count against its session cap, so that a
        pool cannot hold more desktops than the key could run. One change at a time: two
        at once each passed the cap before either was set.
        """
        async with self._setting_pools.setdefault(owner, asyncio.Lock()):
            return await self._set_pool(owner, snapshot_id, size)

    async def _set_pool(self, owner: str, snapshot_id: str, size: int) -> SnapshotRecord:
        snapshot = await asyncio.to_thread(self._store.get, owner, snapshot_id)
        if self._pool is None or self._pool.backend != snapshot.backend:
            raise InvalidRequest("this server has no warm pool for the snapshot's backend "
                                 f"{snapshot.backend!r}")
        key = self.pool_key(snapshot)
        others = sum(self._pool.target(k) for k in self._pool.snapshot_keys(owner) if k != key)
        cap = self._cap_per_key
        if others + size > cap:
            raise InvalidRequest(
                f"the pools of this key's snapshots may keep {cap} copies in all "
                f"({others} kept for other snapshots)"
            )
        engine = self._engines.get(snapshot.backend)
        if size > 0 and engine is not None:
            self._store.want_unpacked(snapshot.id)
            # Before the pool starts restoring: its copies get the fast form at once.
            await engine.keep_for_restores(key.directory)
        snapshot = snapshot.model_copy(update={"pool_size": size})
        await asyncio.to_thread(self._store.save, snapshot)
        await self._pool.set_target(key, size)
        if size == 0:
            await self._pool.settled(key)
            await self.drop_unpacked(snapshot)
        return snapshot

    async def drop_unpacked(self, snapshot: SnapshotRecord) -> None:
        """Remove the form its engine kept for a pool's restores, once none reads it: it
        stayed for good, several times the archive's size, counted nowhere."""
        engine = self._engines.get(snapshot.backend)
        kept = engine.kept_for_restores(self._store.directory(snapshot.id)) if engine else None
        if kept is not None:
            await asyncio.to_thread(self._store.drop_unpacked, snapshot.id, kept)
