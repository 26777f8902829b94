"""The ``kubernetes`` engine: each session a Pod of the session image's OCI form, made
through the Kubernetes API over one kept client (cluster.py).

Per session: a NetworkPolicy (made first, so the pod never runs without it), the Pod, and a
Secret with the agent's token, owned by the Pod. The pod runs the image's own init and
agent; the agent listens on the pod IP and serves only connections that prove the token
(agent_tcp.py), and no Service exposes it. Freeze and checkpoints are refused: the
Kubernetes API has neither a pause nor a restore (see ``hint``).

One watch per engine (list, then watch from its resourceVersion, again after every end)
follows the fleet's pods, so that a pod that ends on its own (evicted, deleted, its init
exited, out of memory) fails its session with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from ...errors import DeskboxError, Internal, SessionFailed, Timeout
from ..base import AgentStream, Capability, Engine, SessionSpec
from ..in_thread import answered
from ..network import resolve_egress
from .agent_tcp import connect_agent
from .cluster import Cluster, Obj
from .deletes import DeleteRetries
from .records import ClusterRecords
from .replicas import Heartbeat
from .sandbox import PodSandbox
from .spec import (
    AGENT_PORT,
    LABEL_FLEET,
    LABEL_POOL,
    LABEL_REPLICA,
    LABEL_SESSION,
    PodLimits,
    PodOptions,
    claim_manifest,
    claim_name,
    egress_rules,
    network_policy_manifest,
    pod_manifest,
    pod_name,
    secret_manifest,
    secret_token,
)

__all__ = ["KubernetesEngine", "KubernetesOptions"]

log = logging.getLogger("deskbox.kubernetes")
_POLL_S = 0.25
_WATCH_S = 60  # one watch's length; the next starts from where it ended
_RETRY_S = 2.0
# A container waiting for one of these will not start without someone changing something.
_HOPELESS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                       "CreateContainerConfigError", "CreateContainerError",
                       "RunContainerError", "CrashLoopBackOff", "ErrImageNeverPull"})


@dataclass(frozen=True)
class KubernetesOptions:
    api: str  # the API server's URL; empty: in-cluster, else the kubeconfig
    namespace: str  # empty: the server pod's own namespace, else "default"
    image: str  # the session image, as the cluster's nodes pull it
    fleet: str = "deskbox"
    server_namespace: str = ""  # the server's, when the sessions' is another
    runtime_class: str = ""
    image_pull_policy: str = "IfNotPresent"
    storage_class: str = ""  # the volumes' claims'; empty: the cluster's default
    max_execs: int = 8
    # This server among the fleet's replicas (labels its warm pods), and its pod's uid
    # (owns them: the garbage collector removes a replica's warm pods with it).
    replica: str = ""
    replica_uid: str = ""
    # The replica's Lease's duration (replicas.py): renewed every third of it; a replica's
    # Lease unchanged for three is of a dead one, whose leftovers the others remove.
    lease_s: int = 30


class KubernetesEngine(Engine[PodSandbox]):
    name: ClassVar[str] = "kubernetes"
    capabilities: frozenset[Capability] = frozenset(
        {Capability.EXEC, Capability.RESOURCES, Capability.ADOPT, Capability.VOLUMES})
    egress_modes: ClassVar[frozenset[str]] = frozenset({"none", "allowlist", "all"})
    runtime_classes: ClassVar[bool] = True
    hint: ClassVar[str] = (
        "the Kubernetes API can neither pause nor checkpoint a pod (that needs the "
        "kubelet's checkpoint API, or agent-sandbox's pause and snapshots); the container "
        "and vm backends have them")
    # A node may have to pull the image first.
    start_timeout_floor_s: ClassVar[float] = 120.0
    handshake_timeout_s: ClassVar[float] = 10.0
    create_cancellable: ClassVar[bool] = True

    def __init__(self, options: KubernetesOptions) -> None:
        self.options = options
        self.pods = PodOptions(image=options.image, fleet=options.fleet,
                               runtime_class=options.runtime_class,
                               image_pull_policy=options.image_pull_policy,
                               server_namespace=options.server_namespace,
                               storage_class=options.storage_class,
                               replica=options.replica, replica_uid=options.replica_uid)
        self.cluster = Cluster(options.api, options.namespace)
        self.records = ClusterRecords(self.cluster, options.fleet)
        self.shared_records = self.records
        self._deletes = {"pod": self.cluster.delete_pod, "secret": self.cluster.delete_secret,
                         "network policy": self.cluster.delete_network_policy}
        self.retries = DeleteRetries(self._deletes, lambda: self.cluster.namespace)
        self._sandboxes: dict[str, PodSandbox] = {}
        self._watcher: asyncio.Task[None] | None = None
        # A replica's heartbeat (only a fleet's replicas label what they make with a name).
        self._heartbeat = Heartbeat(self.cluster, options.fleet, options.replica,
                                    options.lease_s, self._remove_replica
                                    ) if options.replica else None
        self._heartbeating: asyncio.Task[None] | None = None

    @property
    def _selector(self) -> str:
        return f"{LABEL_FLEET}={self.options.fleet}"

    def describe(self) -> dict[str, str]:
        return {"api": self.cluster.where, "namespace": self.cluster.namespace,
                "image": self.options.image, "fleet": self.options.fleet,
                "runtime_class": self.options.runtime_class or "(the cluster's default)"}

    async def prepare(self) -> None:
        if not self.options.image:
            raise Internal("the kubernetes engine needs DESKBOX_KUBERNETES_IMAGE: the "
                           "session image (desktop_image/oci_image.py) in a registry the "
                           "cluster's nodes pull from")
        await self.cluster.open()
        log.info("kubernetes: pods in namespace %s through %s", self.cluster.namespace,
                 self.cluster.where)
        self._watcher = asyncio.create_task(self._watch(), name="deskbox-kubernetes-watch")
        if self._heartbeat is not None:
            # Renewed before this replica makes anything: a replica of its name that was
            # killed may have left its Lease to expire, and its judges to remove what is new.
            await self._heartbeat.renew()
            self._heartbeating = asyncio.create_task(self._heartbeat.run(),
                                                     name="deskbox-kubernetes-lease")

    async def close(self) -> None:
        # Its Lease is left to expire: what this replica failed to delete goes with it.
        for task in (self._watcher, self._heartbeating):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._watcher = self._heartbeating = None
        await self.retries.close()
        await self.cluster.close()

    # -- start and stop --------------------------------------------------------------------

    async def create(self, spec: SessionSpec, timeout_s: float) -> PodSandbox:
        sandbox = PodSandbox(self.options.max_execs, spec.id, secrets.token_urlsafe(32))
        started = time.monotonic()
        egress = await self._egress_rules(spec)
        try:
            async with asyncio.timeout(timeout_s):
                # Each create runs to its answer, also when cancelled (a delete of the
                # starting session, the start's timeout): the API server makes the object
                # all the same, and destroy must find it to delete it.
                await answered(self.cluster.create_network_policy(
                    network_policy_manifest(self.pods, spec.id, egress)))
                for volume in spec.volumes:  # made on first use; kept after the pod
                    await self.cluster.create_claim(claim_manifest(self.pods, volume))
                self._sandboxes[spec.id] = sandbox
                self._check_fresh()
                pod = await answered(self.cluster.create_pod(
                    pod_manifest(self.pods, spec.id, spec.desktop, _limits(spec),
                                 spec.runtime_class, warm=spec.background,
                                 volumes=spec.volumes)))
                await answered(self.cluster.create_secret(
                    secret_manifest(self.pods, pod, spec.id, sandbox.token)))
                sandbox.timings["pod_created"] = time.monotonic() - started
                await self._wait_running(sandbox)
                sandbox.timings["pod_running"] = time.monotonic() - started
                await self._wait_for_agent(sandbox)
        except TimeoutError:
            await asyncio.shield(self.destroy(sandbox))
            raise Timeout(f"{sandbox.label} did not start in {timeout_s:.0f} s"
                          f"{sandbox.waiting_for}") from None
        except BaseException:
            await asyncio.shield(self.destroy(sandbox))
            raise
        sandbox.timings["agent_ready"] = time.monotonic() - started
        return sandbox

    async def _egress_rules(self, spec: SessionSpec) -> list[Obj]:
        if spec.network is None or spec.network.egress == "none":
            return []
        egress = await asyncio.to_thread(resolve_egress, spec.network.egress,
                                         spec.network.allow)
        return egress_rules(spec.network.egress, [str(a) for a in egress.addresses])

    async def _wait_running(self, sandbox: PodSandbox) -> None:
        while True:
            pod = await self.cluster.read_pod(sandbox.name)
            if pod is None:
                raise SessionFailed(f"{sandbox.label} was deleted while it started")
            status = pod.get("status") or {}
            if (problem := _pod_problem(pod)) is not None:
                raise SessionFailed(f"{sandbox.label} {problem}")
            if status.get("phase") == "Running" and status.get("podIP"):
                sandbox.pod_ip = str(status["podIP"])
                return
            sandbox.waiting_for = _waiting_for(pod)
            await asyncio.sleep(_POLL_S)

    async def _wait_for_agent(self, sandbox: PodSandbox) -> None:
        sandbox.waiting_for = " (its agent did not listen)"
        while True:
            if sandbox.ended is not None:
                raise SessionFailed(f"{sandbox.label} {sandbox.ended} before its agent "
                                    "listened")
            try:
                _, writer = await connect_agent(sandbox.pod_ip, AGENT_PORT, sandbox.token,
                                                1024)
            except SessionFailed:
                await asyncio.sleep(_POLL_S / 2)
                continue
            writer.close()
            return

    def _check_fresh(self) -> None:
        """Refuse to make a pod while this replica's Lease is stale: another replica may
        take it for dead, and remove the pod's policy (and with it its confinement)."""
        if self._heartbeat is not None and not self._heartbeat.fresh:
            raise SessionFailed(f"this server could not renew its lease in the cluster "
                                f"({self._heartbeat.stale_for}); try again")

    async def claimed(self, sandbox: PodSandbox) -> None:
        # A session's pod outlives the replica that made it (another one serves it then).
        await self.cluster.patch_pod(sandbox.name, {"metadata": {
            "labels": {LABEL_POOL: None}, "ownerReferences": None}})

    async def open_stream(self, sandbox: PodSandbox, read_limit: int) -> AgentStream:
        if sandbox.ended is not None:
            raise SessionFailed(f"{sandbox.label} {sandbox.ended}")
        return await connect_agent(sandbox.pod_ip, AGENT_PORT, sandbox.token, read_limit)

    async def kill(self, sandbox: PodSandbox) -> None:
        # Forgotten first, as in destroy: the watch then does not take this delete for
        # someone else's.
        self._sandboxes.pop(sandbox.session_id, None)
        await self.cluster.delete_pod(sandbox.name)

    async def destroy(self, sandbox: PodSandbox) -> None:
        self._sandboxes.pop(sandbox.session_id, None)
        # Never raised for a dead sandbox: what the API server fails to delete is asked
        # again in the background (deletes.py; the Secret also goes with its pod, which
        # owns it).
        await self._delete_each(sandbox.name, ("pod", "secret", "network policy"))

    async def adopt(self, session_id: str) -> PodSandbox:
        sandbox = PodSandbox(self.options.max_execs, session_id)
        pod = await self.cluster.read_pod(sandbox.name)
        if pod is None:
            raise SessionFailed(f"{sandbox.label} is gone")
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if (labels.get(LABEL_SESSION) != session_id
                or labels.get(LABEL_FLEET) != self.options.fleet):
            raise SessionFailed(f"{sandbox.label} is not this fleet's")
        if (problem := _pod_problem(pod)) is not None:
            raise SessionFailed(f"{sandbox.label} {problem}")
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or not status.get("podIP"):
            raise SessionFailed(f"{sandbox.label} is not running ({status.get('phase')})")
        secret = await self.cluster.read_secret(sandbox.name)
        if secret is None or not (token := secret_token(secret)):
            raise SessionFailed(f"{sandbox.label}'s agent token (its Secret) is gone")
        sandbox.token, sandbox.pod_ip = token, str(status["podIP"])
        self._sandboxes[session_id] = sandbox
        return sandbox

    async def remove_left(self, session_id: str) -> None:
        # Its pod may never have run (a start cut short): nothing to adopt, all to delete.
        await self.destroy(PodSandbox(self.options.max_execs, session_id))

    def forget(self, sandbox: PodSandbox) -> None:
        if self._sandboxes.get(sandbox.session_id) is sandbox:
            del self._sandboxes[sandbox.session_id]

    async def drop_volume(self, key: str) -> None:
        if await self.cluster.delete_claim(claim_name(key)):
            log.info("deleted the persistent volume claim %s of volume %s", claim_name(key),
                     key)

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        """Remove the fleet's pods of sessions not in ``keep``, and the policies and
        Secrets of pods never made; never another replica's warm pods and their policies
        (its own pod owns them, and the garbage collector removes them with it)."""
        removed = []
        pods, _ = await self.cluster.list_pods(self._selector)
        for pod in pods:
            labels = (pod.get("metadata") or {}).get("labels") or {}
            session_id = str(labels.get(LABEL_SESSION, ""))
            if (session_id in keep or session_id in self._sandboxes
                    or (LABEL_POOL in labels and self._peers(labels))):
                continue
            await self.destroy(PodSandbox(self.options.max_execs, session_id))
            removed.append(session_id)
        have = {pod_name(s) for s in (*keep, *self._sandboxes)}
        for policy in await self.cluster.list_network_policies(self._selector):
            meta = policy.get("metadata") or {}
            name = str(meta.get("name", ""))
            if name and name not in have and not self._peers(meta.get("labels") or {}):
                # A pod never made: a refusal must not stop the server's start.
                await self._delete_each(name, ("network policy", "secret"))
        return removed

    async def _remove_replica(self, replica: str) -> bool:
        """Remove what a dead replica of the fleet left (replicas.py): its warm pods, with
        their Secrets and policies, and its policies of no pod (a create it did not end,
        a delete the API server refused); whether all of it went. Never its sessions'
        pods: the other replicas serve them."""
        selector = f"{self._selector},{LABEL_REPLICA}={replica}"
        pods, _ = await self.cluster.list_pods(selector)
        serving, removed = set(), True
        for pod in pods:
            meta = pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            # A warm pod has no record in the fleet; one with a record was claimed, and
            # only its label stayed (claimed() is not retried).
            if (LABEL_POOL not in labels or await self.records.read(
                    str(labels.get(LABEL_SESSION, ""))) is not None):
                serving.add(str(meta.get("name", "")))
                continue
            removed &= await self._delete_each(str(meta.get("name", "")),
                                               ("pod", "secret", "network policy"),
                                               retry=False)
        for policy in await self.cluster.list_network_policies(selector):
            name = str((policy.get("metadata") or {}).get("name", ""))
            if name and name not in serving:
                removed &= await self._delete_each(name, ("network policy", "secret"),
                                                   retry=False)
        return removed

    async def _delete_each(self, name: str, kinds: tuple[str, ...], retry: bool = True
                           ) -> bool:
        """Delete the objects of these kinds named ``name``, each whatever became of the
        others; one the API server refuses is logged and, with ``retry``, asked again in
        the background (else left to the caller's next pass: the judge of dead replicas
        keeps their Lease until all went). Whether none was refused."""
        deleted = True
        for what in kinds:
            try:
                await self._deletes[what](name)
            except DeskboxError as error:
                log.warning("deleting the %s %s: %s", what, name, error)
                deleted = False
                if retry:
                    self.retries.add(what, name, error)
        return deleted

    def _peers(self, labels: Obj) -> bool:
        """Whether the object is labelled as another replica's."""
        replica = labels.get(LABEL_REPLICA)
        return bool(replica) and replica != self.options.replica

    # -- the watch -------------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            try:
                await self._follow()
            except DeskboxError as error:
                log.warning("watching the pods: %s", error)
            except Exception:  # the watch must outlive whatever an API server sends
                log.exception("watching the pods failed")
            await asyncio.sleep(_RETRY_S)

    async def _follow(self) -> None:
        """One list, then one watch from its resourceVersion (an informer's loop)."""
        known = {s.name: s for s in self._sandboxes.values() if s.pod_ip}
        pods, version = await self.cluster.list_pods(self._selector)
        listed = {str(p["metadata"]["name"]) for p in pods}
        for pod in pods:
            self._observe("MODIFIED", pod)
        for name, sandbox in known.items():
            if name not in listed and sandbox.ended is None:
                sandbox.ended = "was deleted by someone else"
        async for kind, pod in self.cluster.watch_pods(self._selector, version, _WATCH_S):
            self._observe(kind, pod)

    def _observe(self, kind: str, pod: Obj) -> None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        sandbox = self._sandboxes.get(str(labels.get(LABEL_SESSION, "")))
        if sandbox is None or sandbox.ended is not None:
            return
        # Our own deletes forget the sandbox first: any other is someone else's.
        if kind == "DELETED" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            sandbox.ended = "was deleted by someone else"
        elif sandbox.pod_ip and (problem := _pod_problem(pod)) is not None:
            sandbox.ended = problem


def _limits(spec: SessionSpec) -> PodLimits:
    if spec.resources is None:
        return PodLimits()
    return PodLimits(cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb)


def _container_state(pod: Obj) -> Obj:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    state = statuses[0].get("state") or {}
    return state if isinstance(state, dict) else {}


def _pod_problem(pod: Obj) -> str | None:
    """Why a pod will not run (any more), or None while it runs or may still start."""
    status = pod.get("status") or {}
    state = _container_state(pod)
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        ended = state.get("terminated") or {}
        if ended.get("reason") == "OOMKilled":
            return "ran out of memory"
        if ended:
            return f"stopped ({ended.get('reason', phase)}, exit code {ended.get('exitCode')})"
        # Ended with no container status: evicted, or its node lost.
        return f"stopped ({status.get('reason') or phase}: {status.get('message', '')})"
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in _HOPELESS:
        return f"cannot start: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return None


def _waiting_for(pod: Obj) -> str:
    """What a pending pod waits for, for the timeout's message."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "False" and condition.get("message"):
            return f" ({condition.get('reason')}: {condition['message']})"
    waiting = _container_state(pod).get("waiting") or {}
    if waiting.get("reason"):
        return f" (its container waits: {waiting['reason']})"
    return f" (pod phase {status.get('phase', 'unknown')})"

