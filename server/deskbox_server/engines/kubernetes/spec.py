"""What the kubernetes engine asks the API for: one session's Pod, its Secret (the agent's
token) and its NetworkPolicy, as Kubernetes JSON.

The Pod runs the session image's own init and agent (as a docker container does), confined
as far as a pod spec can say it: no capability, no privilege escalation, the runtime's
default seccomp profile, a read-only root with memory-backed emptyDirs where a desktop
writes, requests = limits from ``resources``, no service account token, no service links.
The agent listens on TCP on the pod IP and serves only connections that prove the token
the Secret carries (agent_tcp.py). No Service exposes it.

A session's volumes are PersistentVolumeClaims, one per Deskbox volume (named after its
owner and name, made on first use with the volume's size, deleted with the volume), mounted
where the session asked, read-only or not.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from ..base import VolumeAttach
from ..desktop_commands import DesktopSpec, session_env
from ..own_desktop import OWN_DISPLAY, OWN_HOME
from .cluster import Obj

__all__ = [
    "AGENT_PORT",
    "LABEL_FLEET",
    "LABEL_POOL",
    "LABEL_REPLICA",
    "LABEL_SESSION",
    "PodLimits",
    "PodOptions",
    "claim_manifest",
    "claim_name",
    "egress_rules",
    "network_policy_manifest",
    "owned_by",
    "pod_manifest",
    "pod_name",
    "secret_manifest",
    "secret_token",
]

AGENT_PORT = 7878
LABEL_SESSION = "deskbox.io/session"
# One fleet's pods: every server replica of the same fleet serves them.
LABEL_FLEET = "deskbox.io/fleet"
# "warm" on a pod the warm pool started ahead of demand, removed when a create claims it.
LABEL_POOL = "deskbox.io/pool"
# The server replica that made the object (its pod's name, when the server runs in a pod).
LABEL_REPLICA = "deskbox.io/replica"
_LABEL_NAME = "app.kubernetes.io/name"
_TOKEN_DIR = "/etc/deskbox-agent"
_TOKEN_KEY = "token"


def pod_name(session_id: str) -> str:
    """A DNS-1123 name: session ids are ``ses_<hex>``."""
    return "deskbox-" + session_id.lower().replace("_", "-").replace(".", "-")


@dataclass(frozen=True)
class PodOptions:
    image: str
    fleet: str
    runtime_class: str = ""
    image_pull_policy: str = "IfNotPresent"
    # The server's pods, allowed in to the agent's port by the NetworkPolicy; in
    # ``server_namespace`` when the sessions have a namespace of their own.
    server_selector: tuple[tuple[str, str], ...] = ((_LABEL_NAME, "deskbox-server"),)
    server_namespace: str = ""
    # The claims' StorageClass; empty: the cluster's default.
    storage_class: str = ""
    # The server replica making the objects (its pod's name and uid, or empty).
    replica: str = ""
    replica_uid: str = ""


@dataclass(frozen=True)
class PodLimits:
    cpus: float = 1.0
    memory_mb: int = 2048
    # emptyDir sizes in MiB (memory-backed: they count against the memory limit too).
    tmp_mb: int = 512
    home_mb: int = 512
    run_mb: int = 64
    shm_mb: int = 64


def _labels(options: PodOptions, session_id: str) -> dict[str, str]:
    labels = {_LABEL_NAME: "deskbox-session", "app.kubernetes.io/managed-by": "deskbox",
              LABEL_FLEET: options.fleet, LABEL_SESSION: session_id}
    if options.replica:
        labels[LABEL_REPLICA] = options.replica
    return labels


def _owned_by_server(options: PodOptions) -> list[Obj]:
    """A warm pod belongs to the replica that started it: the garbage collector removes it
    with that replica's pod (a claim lets go of it). Only within one namespace: an owner
    in another namespace reads as missing, and the collector would remove it at once."""
    if not (options.replica and options.replica_uid) or options.server_namespace:
        return []
    return [{"apiVersion": "v1", "kind": "Pod", "name": options.replica,
             "uid": options.replica_uid, "blockOwnerDeletion": False}]


def owned_by(pod: Obj) -> list[Obj]:
    """Owned by this pod: deleted with it by the garbage collector."""
    meta = pod["metadata"]
    return [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
             "blockOwnerDeletion": False}]


def claim_name(key: str) -> str:
    """The claim of the volume ``key`` (``<owner>/<name>``: a DNS-1123 name whatever the
    owner's id is made of)."""
    return "deskbox-vol-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def claim_manifest(options: PodOptions, volume: VolumeAttach) -> Obj:
    """A volume's claim: not owned by any pod (it outlives sessions); ReadWriteOnce, as
    every storage class offers (the server lets one session write, or several read)."""
    spec: Obj = {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": f"{volume.size_mb}Mi"}}}
    if options.storage_class:
        spec["storageClassName"] = options.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim_name(volume.key), "labels": {
                _LABEL_NAME: "deskbox-volume", "app.kubernetes.io/managed-by": "deskbox",
                LABEL_FLEET: options.fleet}},
            "spec": spec}


def pod_manifest(options: PodOptions, session_id: str, desktop: DesktopSpec,
                 limits: PodLimits, runtime_class: str | None = None, warm: bool = False,
                 volumes: Sequence[VolumeAttach] = ()) -> Obj:
    agent = ["/usr/local/bin/deskbox-agent", "--listen", f"tcp:0.0.0.0:{AGENT_PORT}",
             "--token-file", f"{_TOKEN_DIR}/{_TOKEN_KEY}"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": OWN_HOME, "LANG": "C.UTF-8",
           **session_env(desktop, OWN_DISPLAY, agent)}
    cpu = f"{round(limits.cpus * 1000)}m"
    memory = f"{limits.memory_mb}Mi"

    def memory_dir(name: str, size_mb: int) -> Obj:
        return {"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size_mb}Mi"}}

    runtime = runtime_class if runtime_class is not None else options.runtime_class
    spec: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostname": "deskbox",
        "terminationGracePeriodSeconds": 2,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "desktop",
            "image": options.image,
            "imagePullPolicy": options.image_pull_policy,
            "env": [{"name": name, "value": value} for name, value in env.items()],
            "ports": [{"name": "agent", "containerPort": AGENT_PORT, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": cpu, "memory": memory},
                          "limits": {"cpu": cpu, "memory": memory}},
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": [
                {"name": "agent-token", "mountPath": _TOKEN_DIR, "readOnly": True},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "run", "mountPath": "/run"},
                {"name": "home", "mountPath": OWN_HOME},
                {"name": "shm", "mountPath": "/dev/shm"},
            ],
        }],
        "volumes": [
            {"name": "agent-token",
             "secret": {"secretName": pod_name(session_id), "defaultMode": 0o400}},
            memory_dir("tmp", limits.tmp_mb),
            memory_dir("run", limits.run_mb),
            memory_dir("home", limits.home_mb),
            memory_dir("shm", limits.shm_mb),
        ],
    }
    for index, volume in enumerate(volumes):
        spec["containers"][0]["volumeMounts"].append(
            {"name": f"volume-{index}", "mountPath": volume.path,
             "readOnly": volume.read_only})
        spec["volumes"].append(
            {"name": f"volume-{index}", "persistentVolumeClaim": {
                "claimName": claim_name(volume.key), "readOnly": volume.read_only}})
    if runtime:
        spec["runtimeClassName"] = runtime
    labels = _labels(options, session_id)
    metadata: Obj = {"name": pod_name(session_id), "labels": labels}
    if warm:
        labels[LABEL_POOL] = "warm"
        if owners := _owned_by_server(options):
            metadata["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def secret_manifest(options: PodOptions, pod: Obj, session_id: str, token: str) -> Obj:
    """The agent's token, owned by its pod (the garbage collector removes it with it)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": pod_name(session_id), "labels": _labels(options, session_id),
                         "ownerReferences": owned_by(pod)},
            "data": {_TOKEN_KEY: base64.b64encode(token.encode()).decode()}}


def secret_token(secret: Obj) -> str:
    return base64.b64decode((secret.get("data") or {}).get(_TOKEN_KEY, "")).decode()


def egress_rules(egress: str, allowed: list[str]) -> list[Obj]:
    """``none``: nothing; ``all``: anywhere; ``allowlist``: these addresses (CIDRs the
    engine resolved at create time) and the cluster's DNS."""
    if egress == "none":
        return []
    if egress == "all":
        return [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]}]
    cidrs = sorted({str(ipaddress.ip_network(a)) for a in allowed})
    dns = {"to": [{"namespaceSelector": {},
                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
           "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    return [{"to": [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]}, dns]


def network_policy_manifest(options: PodOptions, session_id: str, egress: list[Obj]) -> Obj:
    """In: only the server's pods, to the agent's port. Out: ``egress`` (egress_rules)."""
    server: Obj = {"podSelector": {"matchLabels": dict(options.server_selector)}}
    if options.server_namespace:
        server["namespaceSelector"] = {"matchLabels": {
            "kubernetes.io/metadata.name": options.server_namespace}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": pod_name(session_id), "labels": _labels(options, session_id)},
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SESSION: session_id}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [server],
                "ports": [{"protocol": "TCP", "port": AGENT_PORT}],
            }],
            "egress": egress,
        },
    }
