"""Persistent volumes (API.md "Volumes and browser profiles"): ``POST /v1/volumes``,
``GET /v1/volumes``, ``GET/DELETE /v1/volumes/{name}``, owned by the API key like sessions."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from ..schemas.volumes import Volume, VolumeCreate, VolumeList
from ..sessions.volumes import VolumeRecord, VolumeStore
from .deps import Caller, get_services

__all__ = ["router"]

router = APIRouter(prefix="/v1/volumes", tags=["volumes"])


async def _resources(store: VolumeStore, records: list[VolumeRecord]) -> list[Volume]:
    # The images' sizes are read off the event loop; the attachments live on it.
    used = await asyncio.to_thread(lambda: [store.used_bytes(r) for r in records])
    return [Volume(name=r.name, size_mb=r.size_mb, created_at=r.created_at, used_bytes=u,
                   attached=store.attachments(r)) for r, u in zip(records, used, strict=True)]


@router.post("", status_code=201, response_model=Volume)
async def create_volume(request: Request, caller: Caller, body: VolumeCreate) -> Volume:
    """A new empty volume: a file system of ``size_mb`` (409 if the name is taken)."""
    store = get_services(request).manager.volumes
    record = await store.create(caller.key_id, body)
    return (await _resources(store, [record]))[0]


@router.get("", response_model=VolumeList)
async def list_volumes(request: Request, caller: Caller) -> VolumeList:
    store = get_services(request).manager.volumes
    records = await asyncio.to_thread(store.list, caller.key_id)
    return VolumeList(volumes=await _resources(store, records))


@router.get("/{name}", response_model=Volume)
async def get_volume(request: Request, caller: Caller, name: str) -> Volume:
    store = get_services(request).manager.volumes
    record = await asyncio.to_thread(store.get, caller.key_id, name)
    return (await _resources(store, [record]))[0]


@router.delete("/{name}", status_code=204)
async def delete_volume(request: Request, caller: Caller, name: str) -> Response:
    """Delete a volume and its files (409 while a session has it attached)."""
    await get_services(request).manager.delete_volume(caller.key_id, name)
    return Response(status_code=204)
