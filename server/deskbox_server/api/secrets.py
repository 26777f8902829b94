"""Secrets (API.md "Secrets"): ``POST /v1/secrets``, ``GET /v1/secrets``,
``GET/DELETE /v1/secrets/{name}``, owned by the API key. No route answers a value."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from ..schemas.secrets import Secret, SecretCreate, SecretList
from ..sessions.secrets import SecretRecord
from .deps import Caller, get_services

__all__ = ["router"]

router = APIRouter(prefix="/v1/secrets", tags=["secrets"])


def _resource(record: SecretRecord) -> Secret:
    return Secret(name=record.name, allowed_origins=record.allowed_origins,
                  created_at=record.created_at)


@router.post("", status_code=201, response_model=Secret)
async def create_secret(request: Request, caller: Caller, body: SecretCreate) -> Secret:
    """Store a secret, encrypted (409 if the name is taken: delete it to replace it)."""
    return _resource(await get_services(request).manager.store_secret(caller.key_id, body))


@router.get("", response_model=SecretList)
async def list_secrets(request: Request, caller: Caller) -> SecretList:
    store = get_services(request).manager.secrets
    records = await asyncio.to_thread(store.list, caller.key_id)
    return SecretList(secrets=[_resource(r) for r in records])


@router.get("/{name}", response_model=Secret)
async def get_secret(request: Request, caller: Caller, name: str) -> Secret:
    store = get_services(request).manager.secrets
    return _resource(await asyncio.to_thread(store.get, caller.key_id, name))


@router.delete("/{name}", status_code=204)
async def delete_secret(request: Request, caller: Caller, name: str) -> Response:
    store = get_services(request).manager.secrets
    await asyncio.to_thread(store.delete, caller.key_id, name)
    return Response(status_code=204)
