"""The kubernetes engine's manifests (engines/kubernetes/spec.py), as the API receives them:
what the stand-in does not look at (the runtime class) and what only a real cluster's CNI
enforces (egress ``all``)."""

from __future__ import annotations

from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.kubernetes.spec import (
    PodLimits,
    PodOptions,
    egress_rules,
    network_policy_manifest,
    pod_manifest,
    pod_name,
)

OPTIONS = PodOptions(image="registry.example/deskbox-session:1", fleet="eval")


def test_pod_names_are_dns_labels() -> None:
    assert pod_name("ses_0123abcd") == "deskbox-ses-0123abcd"


def test_the_runtime_class_is_the_servers_unless_the_session_names_one() -> None:
    plain = pod_manifest(OPTIONS, "ses_1", DesktopSpec(), PodLimits())
    assert "runtimeClassName" not in plain["spec"]
    gvisor = PodOptions(image=OPTIONS.image, fleet="eval", runtime_class="gvisor")
    assert pod_manifest(gvisor, "ses_1", DesktopSpec(), PodLimits())["spec"][
        "runtimeClassName"] == "gvisor"
    assert pod_manifest(gvisor, "ses_1", DesktopSpec(), PodLimits(), runtime_class="kata")[
        "spec"]["runtimeClassName"] == "kata"


def test_the_agent_listens_on_tcp_with_the_token_file() -> None:
    pod = pod_manifest(OPTIONS, "ses_1", DesktopSpec(width=1024, height=768), PodLimits())
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert '"--listen", "tcp:0.0.0.0:7878", "--token-file", "/etc/deskbox-agent/token"' in (
        env["DESKBOX_AGENT"])
    assert "1024x768x24" in env["DESKBOX_XSERVER"]
    assert pod["metadata"]["labels"]["deskbox.io/fleet"] == "eval"


def test_egress_all_is_anywhere_and_none_is_nothing() -> None:
    assert egress_rules("none", []) == []
    assert egress_rules("all", []) == [
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]}]
    policy = network_policy_manifest(OPTIONS, "ses_1", egress_rules("all", []))
    assert policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "deskbox-server"}}}]
