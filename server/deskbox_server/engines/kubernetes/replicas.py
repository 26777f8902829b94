"""Which of a fleet's server replicas still live, for the removal of what dead ones left.

Each replica keeps a Lease (coordination.k8s.io/v1) ``deskbox-<fleet>.<replica>``,
labelled with the fleet and the replica, renewed every third of its duration
(``DESKBOX_KUBERNETES_LEASE_S``). A replica whose Lease has not moved for three of its
durations is dead: another replica then removes what it made and left (``remove``: its
warm pods, its policies of no pod), and last its Lease. Without this, a replica killed
outright (``kill -9``, a lost node, a pod the Deployment replaced under a new name) left
its warm pods running for good: no replica removes another's warm pods, which it cannot
tell from those of a live one.

A Lease is judged by the judge's own clock: unchanged (its resourceVersion) for so long
since it first saw it so; the replicas' clocks are never compared. A replica that could not
renew its own Lease for one duration makes no pod until it has (``fresh``): the others may
be about to remove what it makes. A replica the API server refuses Leases to (its RBAC
lacks them) keeps none, is never judged, and judges no one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from ...errors import DeskboxError
from .cluster import Cluster, ClusterRefused, Obj
from .spec import LABEL_FLEET, LABEL_REPLICA

__all__ = ["Heartbeat", "lease_manifest", "lease_name"]

log = logging.getLogger("deskbox.kubernetes")
_LABEL_NAME = "app.kubernetes.io/name"
# A Lease unchanged for this many of its durations is of a dead replica: one duration to
# expire, two more for a create its replica began while its Lease was still fresh.
_DEAD_AFTER = 3


def lease_name(fleet: str, replica: str) -> str:
    """A DNS subdomain, one per fleet and replica: a fleet's name has no dot."""
    return f"deskbox-{fleet}.{replica}"


def lease_manifest(fleet: str, replica: str, lease_s: int, now: str) -> Obj:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(fleet, replica), "labels": {
                _LABEL_NAME: "deskbox-replica", "app.kubernetes.io/managed-by": "deskbox",
                LABEL_FLEET: fleet, LABEL_REPLICA: replica}},
            "spec": {**_lease_spec(replica, lease_s, now), "acquireTime": now}}


def _lease_spec(replica: str, lease_s: int, now: str) -> Obj:
    return {"holderIdentity": replica, "leaseDurationSeconds": lease_s, "renewTime": now}


def _micro_time() -> str:
    """Kubernetes' MicroTime."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Heartbeat:
    """This replica's Lease, and the judge of the others'. ``remove(replica)`` removes
    what a dead replica left; whether all of it went (else its Lease stays, for the next
    pass)."""

    def __init__(self, cluster: Cluster, fleet: str, replica: str, lease_s: int,
                 remove: Callable[[str], Awaitable[bool]]) -> None:
        self._cluster = cluster
        self._fleet = fleet
        self._replica = replica
        self._lease_s = lease_s
        self._remove = remove
        self._renewed_at: float | None = None  # time.monotonic()
        self._refused = False  # the API server refuses this server Leases
        self._warned = False
        self._unchanged: dict[str, tuple[str, float]] = {}  # name: (version, since)

    @property
    def fresh(self) -> bool:
        """Whether this replica may make pods: its Lease renewed within one duration (or
        none kept: no one judges it)."""
        if self._refused:
            return True
        return (self._renewed_at is not None
                and time.monotonic() - self._renewed_at < self._lease_s)

    @property
    def stale_for(self) -> str:
        """Since when this replica's Lease was last renewed, for a refusal's message."""
        if self._renewed_at is None:
            return "it has not been made yet"
        return f"last renewed {time.monotonic() - self._renewed_at:.0f} s ago"

    async def run(self) -> None:
        """Renew and judge, every third of a duration, until cancelled."""
        while True:
            await asyncio.sleep(self._lease_s / 3)
            await self.renew()
            if self._refused:
                continue
            try:
                await self.judge()
            except DeskboxError as error:
                log.warning("judging the fleet's replicas by their leases: %s", error)

    async def renew(self) -> None:
        """Renew this replica's Lease, made if there is none (first, or removed by a
        replica that took this one for dead)."""
        name = lease_name(self._fleet, self._replica)
        now = _micro_time()
        try:
            spec = _lease_spec(self._replica, self._lease_s, now)
            if await self._cluster.patch_lease(name, {"spec": spec}) is None:
                await self._cluster.create_lease(
                    lease_manifest(self._fleet, self._replica, self._lease_s, now))
        except ClusterRefused as error:
            if error.upstream_status == 403:
                if not self._refused:
                    log.warning("kubernetes: %s: this replica keeps no lease, so what it "
                                "leaves when killed is never removed (deploy/kubernetes/"
                                "rbac.yaml grants leases)", error)
                self._refused = True
                return
            self._renew_failed(error)
            return
        except DeskboxError as error:
            self._renew_failed(error)
            return
        self._refused = False
        self._renewed_at = time.monotonic()
        if self._warned:
            log.info("kubernetes: this replica's lease %s is renewed again", name)
            self._warned = False

    def _renew_failed(self, error: DeskboxError) -> None:
        if not self._warned:
            log.warning("kubernetes: renewing this replica's lease: %s (it makes no pod "
                        "once the lease is %d s old)", error, self._lease_s)
            self._warned = True

    async def judge(self) -> None:
        """Remove what the replicas whose Lease has not moved for _DEAD_AFTER of its
        durations left, then their Lease."""
        now = time.monotonic()
        unchanged: dict[str, tuple[str, float]] = {}
        selector = f"{_LABEL_NAME}=deskbox-replica,{LABEL_FLEET}={self._fleet}"
        for lease in await self._cluster.list_leases(selector):
            meta = lease.get("metadata") or {}
            name, version = str(meta.get("name", "")), str(meta.get("resourceVersion", ""))
            replica = str((meta.get("labels") or {}).get(LABEL_REPLICA, ""))
            if not replica or replica == self._replica:
                continue
            seen = self._unchanged.get(name)
            since = seen[1] if seen is not None and seen[0] == version else now
            unchanged[name] = (version, since)
            duration_s = _duration(lease, self._lease_s)
            if now - since < _DEAD_AFTER * duration_s:
                continue
            log.warning("kubernetes: replica %s renewed its lease %.0f s ago or more: "
                        "removing what it left", replica, now - since)
            if await self._remove(replica) and await self._deleted(name):
                del unchanged[name]
        self._unchanged = unchanged

    async def _deleted(self, name: str) -> bool:
        try:
            await self._cluster.delete_lease(name)
        except DeskboxError as error:
            log.warning("kubernetes: deleting the lease %s: %s", name, error)
            return False
        return True


def _duration(lease: Obj, default_s: int) -> float:
    """The Lease's own duration (a replica may be set to another than ours)."""
    value = (lease.get("spec") or {}).get("leaseDurationSeconds")
    return float(value) if isinstance(value, int) and value > 0 else float(default_s)
