"""deploy/kubernetes and the objects the engine makes, checked against the Kubernetes
schemas (kubernetes-validate, strict: no field the API would drop), and for least
privilege: nothing cluster-wide, the server held to the "restricted" Pod Security Standard.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deskbox_server.engines.base import VolumeAttach
from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.kubernetes.replicas import lease_manifest
from deskbox_server.engines.kubernetes.spec import (
    LABEL_REPLICA,
    PodLimits,
    PodOptions,
    claim_manifest,
    egress_rules,
    network_policy_manifest,
    pod_manifest,
    secret_manifest,
)

from ..images import REPO

DEPLOY = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests are meant for, and the newest the validator knows.
VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]


def rendered() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/kubernetes` sends: the kustomization's resources."""
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    objects = []
    for name in kustomization["resources"]:
        objects += [o for o in yaml.safe_load_all((DEPLOY / name).read_text()) if o]
    return objects


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_deployed_object_is_valid(version: str) -> None:
    objects = rendered()
    assert {o["kind"] for o in objects} >= {
        "Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Secret",
        "Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_engines_objects_are_valid(version: str) -> None:
    options = PodOptions(image="registry.example.com/deskbox-session:1", fleet="deskbox",
                         runtime_class="gvisor", server_namespace="deskbox",
                         storage_class="fast")
    volumes = (VolumeAttach("work", Path(), "/root/work", key="k_1/work", size_mb=1024),
               VolumeAttach("ref", Path(), "/tmp/ref", True, key="k_1/ref", size_mb=64))
    pod = pod_manifest(options, "ses_0a1b", DesktopSpec(), PodLimits(cpus=0.5),
                       volumes=volumes)
    for volume in volumes:
        kubernetes_validate.validate(claim_manifest(options, volume), version, strict=True)
    pod["metadata"]["uid"] = "5f0c3e4e-2b1a-4c5d-9e8f-0a1b2c3d4e5f"  # as the API answers
    for egress in ("none", "all"):
        kubernetes_validate.validate(
            network_policy_manifest(options, "ses_0a1b", egress_rules(egress, [])), version,
            strict=True)
    kubernetes_validate.validate(network_policy_manifest(
        options, "ses_0a1b", egress_rules("allowlist", ["10.0.0.1", "2001:db8::1"])), version,
        strict=True)
    kubernetes_validate.validate(pod, version, strict=True)
    kubernetes_validate.validate(secret_manifest(options, pod, "ses_0a1b", "t" * 43), version,
                                 strict=True)
    # A replica's warm pod: labelled with the replica, owned by its pod.
    replica = dataclasses.replace(options, server_namespace="", replica="deskbox-server-7c9d",
                                  replica_uid="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    warm = pod_manifest(replica, "ses_0a1c", DesktopSpec(), PodLimits(), warm=True)
    kubernetes_validate.validate(warm, version, strict=True)
    assert warm["metadata"]["labels"][LABEL_REPLICA] == "deskbox-server-7c9d"
    assert warm["metadata"]["ownerReferences"][0]["name"] == "deskbox-server-7c9d"
    # A replica's heartbeat.
    kubernetes_validate.validate(lease_manifest(
        "deskbox", "deskbox-server-7c9d", 30, "2026-12-07T22:00:00.123456Z"), version,
        strict=True)


def test_nothing_is_granted_cluster_wide_and_only_what_the_engine_calls() -> None:
    objects = rendered()
    assert not [o for o in objects if o["kind"].startswith("Cluster")]
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "deskbox-sessions"
    granted = {(r["apiGroups"][0], res): set(r["verbs"])
               for r in role["rules"] for res in r["resources"]}
    assert granted == {
        ("", "pods"): {"create", "get", "list", "watch", "patch", "delete"},
        # list and patch: the session records and tokens the replicas share.
        ("", "secrets"): {"create", "get", "list", "patch", "delete"},
        ("networking.k8s.io", "networkpolicies"): {"create", "list", "delete"},
        ("", "persistentvolumeclaims"): {"create", "delete"},
        # The replicas' heartbeats (engines/kubernetes/replicas.py).
        ("coordination.k8s.io", "leases"): {"create", "list", "patch", "delete"},
    }


def test_the_server_meets_the_restricted_pod_security_standard() -> None:
    objects = rendered()
    namespaces = {o["metadata"]["name"]: o["metadata"]["labels"] for o in objects
                  if o["kind"] == "Namespace"}
    assert namespaces["deskbox"]["pod-security.kubernetes.io/enforce"] == "restricted"
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["metadata"]["namespace"] == "deskbox"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    assert config["DESKBOX_BACKENDS"] == "kubernetes"
    assert config["DESKBOX_KUBERNETES_NAMESPACE"] == "deskbox-sessions"


def test_replicas_share_the_cluster_as_their_registry() -> None:
    objects = rendered()
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    assert config["DESKBOX_REGISTRY"] == "cluster"
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    fields = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in server["env"]}
    assert fields == {"DESKBOX_KUBERNETES_REPLICA": "metadata.name",
                      "DESKBOX_KUBERNETES_REPLICA_UID": "metadata.uid"}


