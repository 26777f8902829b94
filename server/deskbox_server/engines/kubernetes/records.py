"""The cluster as the fleet's registry (``DESKBOX_REGISTRY=cluster``): a Secret per session
(``deskbox-<session id>-record``) holds its record and its session tokens' digests, so that
every server replica serves every session, with no routing of our own.

The Secret is not owned by the session's pod: the record of a stopped session outlives
it, until the registry's sweep. Labels pick a fleet's records, one session's, one API key's
(a hash: key ids are ours, label values have a grammar) and the live ones. Each token is a
key of its own (``token-<sha256>``), so that two replicas issuing tokens at once write two
keys of one merge patch each and lose neither.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Collection

from ..base import SharedEntry
from .cluster import Cluster, ClusterRefused, Obj
from .spec import LABEL_FLEET, LABEL_SESSION, pod_name

__all__ = ["ClusterRecords", "record_name"]

LABEL_OWNER = "deskbox.io/owner"
LABEL_LIVE = "deskbox.io/live"
_LABEL_NAME = "app.kubernetes.io/name"
_RECORD = "record"
_TOKEN = "token-"


def record_name(session_id: str) -> str:
    return pod_name(session_id) + "-record"


def owner_label(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:40]


def _encode(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _entry(secret: Obj) -> SharedEntry | None:
    labels = (secret.get("metadata") or {}).get("labels") or {}
    data = secret.get("data") or {}
    if _RECORD not in data:
        return None
    try:
        decoded = {key: base64.b64decode(value).decode() for key, value in data.items()}
    except (ValueError, TypeError):
        return None  # not ours to read: the registry treats it as no record
    return SharedEntry(
        session_id=str(labels.get(LABEL_SESSION, "")), record=decoded[_RECORD],
        tokens={key[len(_TOKEN):]: value for key, value in decoded.items()
                if key.startswith(_TOKEN)},
        version=str((secret.get("metadata") or {}).get("resourceVersion", "")))


class ClusterRecords:
    """engines/base.py's SharedRecords, in one namespace's Secrets."""

    def __init__(self, cluster: Cluster, fleet: str) -> None:
        self._cluster = cluster
        self._fleet = fleet

    def _selector(self, **more: str) -> str:
        picks = {_LABEL_NAME: "deskbox-record", LABEL_FLEET: self._fleet, **more}
        return ",".join(f"{key}={value}" for key, value in picks.items())

    async def put(self, session_id: str, owner: str, live: bool, record: str) -> None:
        name = record_name(session_id)
        labels = {_LABEL_NAME: "deskbox-record", "app.kubernetes.io/managed-by": "deskbox",
                  LABEL_FLEET: self._fleet, LABEL_SESSION: session_id,
                  LABEL_OWNER: owner_label(owner), LABEL_LIVE: str(live).lower()}
        patch = {"metadata": {"labels": labels}, "data": {_RECORD: _encode(record)}}
        if await self._cluster.patch_secret(name, patch) is not None:
            return
        try:
            await self._cluster.create_secret({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "labels": labels},
                "data": {_RECORD: _encode(record)}})
        except ClusterRefused as error:
            if error.upstream_status != 409:
                raise
            # Made by another replica between our patch and our create: patch it.
            await self._cluster.patch_secret(name, patch)

    async def put_if(self, session_id: str, live: bool, record: str, version: str) -> bool:
        # A merge patch that names a resourceVersion is refused (409) if the object moved on.
        patch = {"metadata": {"resourceVersion": version,
                              "labels": {LABEL_LIVE: str(live).lower()}},
                 "data": {_RECORD: _encode(record)}}
        try:
            return await self._cluster.patch_secret(record_name(session_id), patch) is not None
        except ClusterRefused as error:
            if error.upstream_status == 409:
                return False
            raise

    async def read(self, session_id: str) -> SharedEntry | None:
        secret = await self._cluster.read_secret(record_name(session_id))
        return _entry(secret) if secret is not None else None

    async def _list(self, **labels: str) -> list[SharedEntry]:
        secrets = await self._cluster.list_secrets(self._selector(**labels))
        return [entry for secret in secrets if (entry := _entry(secret)) is not None]

    async def owned(self, owner: str) -> list[SharedEntry]:
        return await self._list(**{LABEL_OWNER: owner_label(owner)})

    async def live(self) -> list[SharedEntry]:
        return await self._list(**{LABEL_LIVE: "true"})

    async def ended(self) -> list[SharedEntry]:
        return await self._list(**{LABEL_LIVE: "false"})

    async def delete(self, session_id: str) -> None:
        await self._cluster.delete_secret(record_name(session_id))

    async def add_token(self, session_id: str, digest: str, token: str,
                        expired: Collection[str] = ()) -> bool:
        data: dict[str, str | None] = {_TOKEN + old: None for old in expired}
        patch = {"data": {**data, _TOKEN + digest: _encode(token)}}
        return await self._cluster.patch_secret(record_name(session_id), patch) is not None

    async def drop_token(self, session_id: str, digest: str) -> None:
        await self._cluster.patch_secret(record_name(session_id),
                                         {"data": {_TOKEN + digest: None}})
