"""Snapshots and forks (API.md): ``POST /v1/sessions/{id}/snapshots``,
``GET /v1/snapshots``, ``GET/DELETE /v1/snapshots/{id}``, ``POST /v1/sessions/{id}/fork``,
and ``PUT /v1/snapshots/{id}/pool`` (ready copies in the warm pool)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..schemas.snapshots import (
    ForkRequest,
    Forks,
    PoolRequest,
    Snapshot,
    SnapshotList,
    SnapshotPool,
)
from ..sessions.snapshots import SnapshotRecord
from .deps import NO_BODY, Caller, get_services
from .sessions import to_resource

__all__ = ["router"]

router = APIRouter(tags=["snapshots"])


def to_snapshot(record: SnapshotRecord, request: Request) -> Snapshot:
    ready = get_services(request).manager.catalog.pool_ready(record)
    return Snapshot(
        id=record.id,
        session_id=record.session_id,
        backend=record.backend,
        display=record.body.display,
        browser=record.body.browser,
        created_at=record.created_at,
        size_bytes=record.size_bytes,
        raw_bytes=record.raw_bytes,
        pool=SnapshotPool(size=record.pool_size, ready=ready),
    )


@router.post("/v1/sessions/{session_id}/snapshots", status_code=201, response_model=Snapshot,
             dependencies=NO_BODY)
async def take_snapshot(request: Request, caller: Caller, session_id: str) -> Snapshot:
    """Checkpoint a running session without stopping it (CRIU ``--leave-running``).

    Actions get 409 while it is taken (about a second); VNC viewers and DevTools clients
    are disconnected and may reconnect.
    """
    record = await get_services(request).manager.copies.snapshot(caller.key_id, session_id)
    return to_snapshot(record, request)


@router.post("/v1/sessions/{session_id}/fork", status_code=201, response_model=Forks)
async def fork(
    request: Request, caller: Caller, session_id: str, body: ForkRequest | None = None
) -> Forks:
    """``count`` new running sessions from this one's current state, each its own sandbox."""
    count = (body or ForkRequest()).count
    records = await get_services(request).manager.copies.fork(caller.key_id, session_id, count)
    return Forks(sessions=[to_resource(r, request) for r in records])


@router.get("/v1/snapshots", response_model=SnapshotList)
async def list_snapshots(request: Request, caller: Caller) -> SnapshotList:
    records = await get_services(request).manager.catalog.list(caller.key_id)
    return SnapshotList(snapshots=[to_snapshot(r, request) for r in records])


@router.get("/v1/snapshots/{snapshot_id}", response_model=Snapshot)
async def get_snapshot(request: Request, caller: Caller, snapshot_id: str) -> Snapshot:
    record = await get_services(request).manager.catalog.get(caller.key_id, snapshot_id)
    return to_snapshot(record, request)


@router.delete("/v1/snapshots/{snapshot_id}", status_code=204, response_class=Response)
async def delete_snapshot(request: Request, caller: Caller, snapshot_id: str) -> Response:
    await get_services(request).manager.catalog.delete(caller.key_id, snapshot_id)
    return Response(status_code=204)


@router.put("/v1/snapshots/{snapshot_id}/pool", response_model=Snapshot)
async def set_pool(
    request: Request, caller: Caller, snapshot_id: str, body: PoolRequest
) -> Snapshot:
    """Keep ``size`` ready copies of the snapshot in the warm pool (0 to stop): a create
    ``from_snapshot`` then takes one at once. Kept over server restarts."""
    catalog = get_services(request).manager.catalog
    record = await catalog.set_pool(caller.key_id, snapshot_id, body.size)
    return to_snapshot(record, request)
