"""The kubernetes engine end to end, through a ``deskbox serve`` whose only backend is
kubernetes, against the stand-in API server (conftest.py, standin.py): a session is a Pod
(with its Secret and NetworkPolicy) whose agent the server reaches over TCP on the pod IP
with the session's token; the desktop answers as on runc; the pod spec carries the
confinement and the limits; what the cluster cannot do is refused with 422; a pod that
ends behind the server's back fails its session; a killed server's pod is adopted by the
next and strangers' pods are swept; and a delete leaves no object behind.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.kubernetes.cluster import Cluster, ClusterRefused

from ..api.containers import act, page_origin
from ..api.containers import create_running as create
from ..api.helpers import assert_error, decode
from ..api.sandbox_page import SandboxPage, events_data_url
from ..api.served import free_port, serve, serve_refused
from ..scratch import scratch_dir
from .conftest import NAMESPACE, StandIn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TEXT = "pod ✓ wörld"
AGENT_PORT = 7878


@dataclass
class Server:
    process: Any
    client: httpx.Client
    state_dir: Path


@contextlib.contextmanager
def kubernetes_server(standin: StandIn, state_dir: Path, log: Path, **extra: str
                      ) -> Iterator[Server]:
    env = {"DESKBOX_BACKENDS": "kubernetes", "DESKBOX_DEFAULT_BACKEND": "kubernetes",
           "DESKBOX_KUBERNETES_API": standin.url, "DESKBOX_KUBERNETES_NAMESPACE": NAMESPACE,
           "DESKBOX_KUBERNETES_IMAGE": standin.image, "DESKBOX_START_TIMEOUT_S": "60",
           **extra}
    with serve(state_dir, log, env, timeout_s=120.0) as (process, client):
        yield Server(process, client, state_dir)


@pytest.fixture(scope="module")
def base(request: pytest.FixtureRequest) -> Path:
    return scratch_dir(request, "deskbox-kubernetes-tests-")


@pytest.fixture(scope="module")
def server(standin: StandIn, base: Path) -> Iterator[Server]:
    with kubernetes_server(standin, base / "state", base / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> httpx.Client:
    return server.client


def pod_name(session: dict[str, Any]) -> str:
    return "deskbox-" + str(session["id"]).replace("_", "-")


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    made = create(client, browser={"start_url": events_data_url()})
    yield made
    client.delete(f"/v1/sessions/{made['id']}")


def wait_failed(client: httpx.Client, session: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        state: dict[str, Any] = client.get(f"/v1/sessions/{session['id']}").json()
        if state["state"] == "failed":
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.2)


def test_healthz_describes_the_engine(client: httpx.Client, standin: StandIn) -> None:
    engine = client.get("/healthz").json()["engines"]["kubernetes"]
    assert engine["capabilities"] == ["adopt", "exec", "resources", "volumes"]
    assert engine["egress"] == ["all", "allowlist", "none"]
    assert engine["details"]["api"] == standin.url
    assert engine["details"]["namespace"] == NAMESPACE
    assert engine["details"]["image"] == standin.image


def test_the_desktop_answers_as_on_runc(client: httpx.Client, session: dict[str, Any]) -> None:
    assert session["backend"] == "kubernetes"
    shot = client.get(f"/v1/sessions/{session['id']}/screenshot")
    assert shot.status_code == 200, shot.text
    assert decode(shot.content).size == (1280, 800)
    with SandboxPage(client, session["id"]) as page:
        page.wait(lambda state: state["clicks"] == 0, timeout_s=30)
        x, y = page_origin(client, session, page)
        act(client, session, {"actions": [{"type": "click", "x": x + 900, "y": y + 175},
                                          {"type": "type", "text": TEXT}]})
        state = page.wait(lambda state: state["value"] == TEXT, timeout_s=30)
    assert state["clicks"] == 2 and state["value"] == TEXT
    ran = client.post(f"/v1/sessions/{session['id']}/exec",
                      json={"cmd": ["sh", "-c", "hostname; ls /sys/class/net"]})
    assert ran.status_code == 200, ran.text
    assert ran.json()["stdout"].split() == ["deskbox", "eth0", "lo"]


def test_the_pod_spec_confines_the_session(session: dict[str, Any], standin: StandIn) -> None:
    pod = standin.pod(pod_name(session))
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False and spec["restartPolicy"] == "Never"
    assert "runtimeClassName" not in spec  # none configured: the cluster's default
    (container,) = spec["containers"]
    assert container["image"] == standin.image
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "privileged": False,
        "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["resources"] == {"requests": {"cpu": "1000m", "memory": "2048Mi"},
                                      "limits": {"cpu": "1000m", "memory": "2048Mi"}}
    assert pod["metadata"]["labels"]["deskbox.io/session"] == session["id"]
    assert pod["metadata"]["labels"]["deskbox.io/fleet"] == "deskbox"
    # The agent's token: a Secret the pod owns (deleted with it), mounted read-only.
    (secret,) = [s for s in standin.objects("secrets") if s["metadata"]["name"] == pod_name(
        session)]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    assert {"name": "agent-token", "mountPath": "/etc/deskbox-agent", "readOnly": True} in (
        container["volumeMounts"])
    # Default egress none: in only from the server's pods to the agent, out nothing.
    (policy,) = [p for p in standin.objects("networkpolicies")
                 if p["metadata"]["name"] == pod_name(session)]
    assert policy["spec"]["podSelector"] == {"matchLabels": {
        "deskbox.io/session": session["id"]}}
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == []
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": AGENT_PORT}]
    # No Service exposes a session.
    assert standin.get("/standin/requests") and not any(
        "/services" in path for _, path in standin.get("/standin/requests"))


def _first_bytes(address: tuple[str, int], send: bytes) -> bytes:
    with socket.create_connection(address, timeout=10) as connection:
        connection.sendall(send)
        connection.settimeout(10)
        chunks = []
        with contextlib.suppress(ConnectionResetError):
            while chunk := connection.recv(4096):
                chunks.append(chunk)
        return b"".join(chunks)


def test_the_agent_serves_only_who_has_the_token(
    session: dict[str, Any], standin: StandIn
) -> None:
    """Any pod of the cluster reaches the agent's port: without the token it gets nothing
    but a closed connection, neither with HTTP/2 at once nor with a wrong token line."""
    address = (standin.pod(pod_name(session))["status"]["podIP"], AGENT_PORT)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
    assert _first_bytes(address, preface) == b""
    assert _first_bytes(address, b"DESKBOX-AGENT-TOKEN " + b"x" * 43 + b"\n" + preface) == b""


def test_what_the_cluster_lacks_is_refused(client: httpx.Client, session: dict[str, Any],
                                           standin: StandIn) -> None:
    before = standin.names("pods")
    for mode in ("freeze", "hibernate"):
        refused = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": mode})
        message = assert_error(refused, 422, "invalid_request")["message"]
        assert "kubernetes engine" in message and "checkpoint API" in message
    assert client.post(f"/v1/sessions/{session['id']}/snapshots").status_code == 422
    assert standin.names("pods") == before


def test_resources_egress_and_runtime_class_become_the_pods(
    client: httpx.Client, standin: StandIn
) -> None:
    made = create(client, resources={"cpus": 0.5, "memory_mb": 1024},
                  network={"egress": "allowlist", "allow": ["127.0.0.1", "10.9.8.7"]},
                  runtime_class="gvisor")
    try:
        pod = standin.pod(pod_name(made))
        assert pod["spec"]["runtimeClassName"] == "gvisor"  # the stand-in runs it as any
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {
            "cpu": "500m", "memory": "1024Mi"}
        (policy,) = [p for p in standin.objects("networkpolicies")
                     if p["metadata"]["name"] == pod_name(made)]
        allowed, dns = policy["spec"]["egress"]
        assert allowed == {"to": [{"ipBlock": {"cidr": "10.9.8.7/32"}},
                                  {"ipBlock": {"cidr": "127.0.0.1/32"}}]}
        assert {"protocol": "UDP", "port": 53} in dns["ports"]
        assert client.get(f"/v1/sessions/{made['id']}/screenshot").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{made['id']}")


def run(client: httpx.Client, session: dict[str, Any], script: str) -> dict[str, Any]:
    ran = client.post(f"/v1/sessions/{session['id']}/exec", json={"cmd": ["sh", "-c", script]})
    assert ran.status_code == 200, ran.text
    result: dict[str, Any] = ran.json()
    return result


def test_a_volume_is_a_claim_that_outlives_its_pods(
    client: httpx.Client, standin: StandIn
) -> None:
    """A Deskbox volume on the cluster: a PersistentVolumeClaim made with the first session
    that mounts it, kept after that session, mounted read-only by the next, deleted with
    the volume (the stand-in binds each claim to a host directory)."""
    assert client.post("/v1/volumes", json={"name": "kwork", "size_mb": 64}).status_code == 201
    try:
        writer = create(client, volumes=[{"name": "kwork", "path": "/root/work"}])
        try:
            (claim,) = standin.objects("persistentvolumeclaims")
            assert claim["spec"] == {"accessModes": ["ReadWriteOnce"],
                                     "resources": {"requests": {"storage": "64Mi"}}}
            pod = standin.pod(pod_name(writer))["spec"]
            (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
            assert volume["persistentVolumeClaim"] == {
                "claimName": claim["metadata"]["name"], "readOnly": False}
            assert {"name": volume["name"], "mountPath": "/root/work", "readOnly": False} in \
                pod["containers"][0]["volumeMounts"]
            assert run(client, writer, "echo kept > /root/work/note")["exit_code"] == 0
            assert_error(client.post("/v1/sessions", json={
                "volumes": [{"name": "kwork", "path": "/root/other"}]}), 409, "conflict")
        finally:
            client.delete(f"/v1/sessions/{writer['id']}")
        reader = create(client, volumes=[{"name": "kwork", "path": "/tmp/ref",
                                          "read_only": True}])
        try:
            assert run(client, reader, "cat /tmp/ref/note")["stdout"] == "kept\n"
            refused = run(client, reader, "echo x > /tmp/ref/x")
            assert refused["exit_code"] != 0 and "Read-only" in refused["stderr"]
        finally:
            client.delete(f"/v1/sessions/{reader['id']}")
        assert standin.names("persistentvolumeclaims") == [claim["metadata"]["name"]]
    finally:
        assert client.delete("/v1/volumes/kwork").status_code == 204
    assert standin.names("persistentvolumeclaims") == []


def test_a_pod_deleted_behind_the_servers_back_fails_its_session(
    client: httpx.Client, standin: StandIn
) -> None:
    doomed = create(client)
    httpx.delete(f"{standin.url}/api/v1/namespaces/{NAMESPACE}/pods/{pod_name(doomed)}")
    state = wait_failed(client, doomed)
    assert "deleted by someone else" in state["failure"]["reason"]
    assert client.delete(f"/v1/sessions/{doomed['id']}").status_code == 204
    assert pod_name(doomed) not in standin.names("networkpolicies")
    assert pod_name(doomed) not in standin.names("secrets")


def test_a_pod_whose_image_cannot_be_pulled_fails_the_create(
    standin: StandIn, base: Path
) -> None:
    with kubernetes_server(standin, base / "noimage-state", base / "noimage.log",
                           DESKBOX_KUBERNETES_IMAGE="registry.invalid/nothing:1") as server:
        refused = server.client.post("/v1/sessions", json={})
        assert "ErrImagePull" in assert_error(refused, 502, "session_failed")["message"]
        assert not [n for n in standin.names("pods") if n in str(refused.json())]


def test_a_throttled_create_waits_and_runs(client: httpx.Client, standin: StandIn) -> None:
    """An API server under load answers 429 with a Retry-After (API Priority and
    Fairness), having done nothing: a Kubernetes client waits that long and asks again.
    The create failed with 502, its session failed."""
    for plural in ("networkpolicies", "pods"):
        armed = httpx.post(f"{standin.url}/standin/fail", json={
            "method": "POST", "plural": plural, "status": 429, "times": 1,
            "retry_after": 1}, timeout=10)
        assert armed.status_code == 200, armed.text
    made = create(client)
    try:
        assert client.get(f"/v1/sessions/{made['id']}/screenshot").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{made['id']}")


def test_delete_leaves_nothing(client: httpx.Client, standin: StandIn) -> None:
    made = create(client)
    name = pod_name(made)
    uid = standin.pod(name)["metadata"]["uid"]
    assert name in standin.names("secrets") and name in standin.names("networkpolicies")
    assert client.delete(f"/v1/sessions/{made['id']}").status_code == 204
    for plural in ("pods", "secrets", "networkpolicies"):
        assert name not in standin.names(plural), plural
    listed = standin.podman.cli("ps", "--all", "--format", "{{.Names}}").stdout.split()
    assert f"standin-{uid}" not in listed


def _stranger(standin: StandIn) -> str:
    """A pod and a policy of this fleet that no server's registry knows (a server that
    lost its state): never started (its image is nowhere), as cheap as a stranger gets."""
    labels = {"deskbox.io/fleet": "deskbox", "deskbox.io/session": "ses_stranger"}
    meta = {"name": "deskbox-ses-stranger", "labels": labels}
    for prefix, plural, body in (
        ("/apis/networking.k8s.io/v1", "networkpolicies",
         {"metadata": meta, "spec": {"podSelector": {}}}),
        ("/api/v1", "pods", {"metadata": meta, "spec": {"containers": [
            {"name": "desktop", "image": "registry.invalid/nothing:1"}]}}),
    ):
        made = httpx.post(f"{standin.url}{prefix}/namespaces/{NAMESPACE}/{plural}", json=body)
        assert made.status_code == 201, made.text
    return str(meta["name"])


def test_a_killed_servers_pod_is_adopted_and_strangers_are_swept(
    standin: StandIn, base: Path
) -> None:
    state_dir, log = base / "restart-state", base / "restart.log"
    with kubernetes_server(standin, state_dir, log) as first:
        kept = create(first.client)
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    assert pod_name(kept) in standin.names("pods")  # the pod outlives its server
    stranger = _stranger(standin)
    with kubernetes_server(standin, state_dir, log) as second:
        again = second.client.get(f"/v1/sessions/{kept['id']}").json()
        assert again["state"] == "running", again
        shot = second.client.get(f"/v1/sessions/{kept['id']}/screenshot")
        assert shot.status_code == 200, shot.text
        assert stranger not in standin.names("pods")
        assert stranger not in standin.names("networkpolicies")
    # A server's shutdown ends its sessions, and their pods.
    assert pod_name(kept) not in standin.names("pods")


def fail_next(standin: StandIn, **fault: Any) -> None:
    armed = httpx.post(f"{standin.url}/standin/fail", json=fault, timeout=10)
    assert armed.status_code == 200, armed.text


READ_DELAY_S = 1.5


def test_reads_the_api_server_fails_at_a_restart_fail_no_session(
    standin: StandIn, base: Path
) -> None:
    """The next server re-adopts a killed one's sessions while the API server fails the
    reads of one's pod and Secret (a 503, then a 504 timeout: an API server restarting
    behind its load balancer, etcd electing a leader), and answers the others' pod reads
    only after 1.5 s: each failed read is asked again, backing off, and the session runs
    on (it was failed at once, its pod deleted). They are re-adopted together: all those
    reads are over within two of the delays (one session after another, they took four s
    or more, and N sessions whose reads the API server fails added N times up to 60 s to a
    start). One whose Secret is gone fails alone, with that reason."""
    state_dir, log = base / "flaky-state", base / "flaky.log"
    with kubernetes_server(standin, state_dir, log) as first:
        with ThreadPoolExecutor(3) as creates:  # together: a pod's start mostly waits
            kept = list(creates.map(lambda _: create(first.client), range(3)))
        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
    names = [pod_name(session) for session in kept]
    for plural in ("pods", "secrets"):
        fail_next(standin, method="GET", plural=plural, name=names[0], status=503, times=1)
        fail_next(standin, method="GET", plural=plural, name=names[0], status=504, times=1)
    for name in names[1:]:
        fail_next(standin, method="GET", plural="pods", name=name, delay=READ_DELAY_S,
                  times=1)
    assert httpx.delete(f"{standin.url}/api/v1/namespaces/{NAMESPACE}/secrets/{names[2]}"
                        ).status_code == 200
    with kubernetes_server(standin, state_dir, log) as second:
        for session in kept[:2]:
            again = second.client.get(f"/v1/sessions/{session['id']}").json()
            assert again["state"] == "running", again
        lost = second.client.get(f"/v1/sessions/{kept[2]['id']}").json()
        assert lost["state"] == "failed", lost
        assert lost["failure"]["reason"] == (
            f"the server restarted and could not re-adopt it: the pod {names[2]}'s agent "
            "token (its Secret) is gone"), lost
        assert standin.get("/standin/fail") == []  # every fault was answered
        faulted = [(came, answered) for _, path, came, answered
                   in standin.get("/standin/faulted") if path.rsplit("/", 1)[-1] in names]
        assert len(faulted) == 6, faulted  # four failed, two delayed
        took_s = max(a for _, a in faulted) - min(c for c, _ in faulted)
        assert took_s < 2 * READ_DELAY_S, f"re-adopted in {took_s:.1f} s"
        shot = second.client.get(f"/v1/sessions/{kept[0]['id']}/screenshot")
        assert shot.status_code == 200, shot.text
        for session in kept:
            assert second.client.delete(f"/v1/sessions/{session['id']}").status_code == 204


async def test_a_read_the_api_server_keeps_failing_fails_in_bounded_time(
    standin: StandIn,
) -> None:
    """Asked again for the cluster's bound (here 2 s), not for ever: then the API server's
    last answer, with how long it was asked (the reason a session that could not be
    re-adopted fails with)."""
    cluster = Cluster(standin.url, NAMESPACE, read_retry_s=2.0)
    await cluster.open()
    try:
        fail_next(standin, method="GET", plural="pods", name="deskbox-ses-flaky", status=503,
                  times=1000)
        started = time.monotonic()
        with pytest.raises(ClusterRefused) as refused:
            await cluster.read_pod("deskbox-ses-flaky")
        assert 1.0 < time.monotonic() - started < 5.0
        assert refused.value.upstream_status == 503
        assert re.search(r"\(503: .*\) \(asked [3-9] times in [12] s\)$",
                         refused.value.message), refused.value.message
    finally:
        async with httpx.AsyncClient() as client:
            await client.delete(f"{standin.url}/standin/fail")
        await cluster.close()


def test_a_sweep_the_api_server_refuses_once_does_not_stop_the_start(
    standin: StandIn, base: Path
) -> None:
    """A stranger's policy (no pod) whose delete the API server refuses (a 503) at the
    next server's start: the server started all the same (the server refused to start
    on that one error before), and the policy is left for a later sweep."""
    meta = {"name": "deskbox-ses-strandedpolicy", "labels": {
        "deskbox.io/fleet": "deskbox", "deskbox.io/session": "ses_strandedpolicy"}}
    policies = f"{standin.url}/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"
    assert httpx.post(policies, json={"metadata": meta, "spec": {"podSelector": {}}}
                      ).status_code == 201
    try:
        armed = httpx.post(f"{standin.url}/standin/fail", json={
            "method": "DELETE", "plural": "networkpolicies", "status": 503, "times": 1})
        assert armed.status_code == 200, armed.text
        with kubernetes_server(standin, base / "sweep-state", base / "sweep.log") as server:
            assert server.client.get("/healthz").status_code == 200
    finally:
        httpx.delete(f"{policies}/{meta['name']}")


def test_a_delete_the_api_server_fails_is_asked_again(
    client: httpx.Client, standin: StandIn
) -> None:
    """The API server fails the deletes of a session's pod (three times: the kill, the
    removal, the first retry) and of its policy (once): the session is stopped at once, and
    the server asks again in the background, backing off, until both are gone. They
    stayed (the pod running its desktop) until a later server's start swept them."""
    made = create(client)
    name = pod_name(made)
    uid = standin.pod(name)["metadata"]["uid"]
    fail_next(standin, method="DELETE", plural="pods", name=name, status=503, times=3)
    fail_next(standin, method="DELETE", plural="networkpolicies", name=name, status=500,
              times=1)
    assert client.delete(f"/v1/sessions/{made['id']}").status_code == 204
    assert client.get(f"/v1/sessions/{made['id']}").json()["state"] == "stopped"
    deadline = time.monotonic() + 10
    while left := [p for p in ("pods", "secrets", "networkpolicies")
                   if name in standin.names(p)]:
        assert time.monotonic() < deadline, f"still there: {left}"
        time.sleep(0.2)
    assert standin.get("/standin/fail") == []  # each failed delete was asked again
    listed = standin.podman.cli("ps", "--all", "--format", "{{.Names}}").stdout.split()
    assert f"standin-{uid}" not in listed


def test_the_warm_pool_is_labelled_pods_claimed_at_create(
    standin: StandIn, base: Path
) -> None:
    def warm() -> list[str]:
        return [p["metadata"]["name"] for p in standin.objects("pods")
                if p["metadata"]["labels"].get("deskbox.io/pool") == "warm"]

    with kubernetes_server(standin, base / "pool-state", base / "pool.log",
                           DESKBOX_POOL_SIZE="1") as server:
        deadline = time.monotonic() + 120
        while not (ready := warm()) or 'deskbox_pool_ready{display="1280x800"} 1' not in (
                server.client.get("/metrics").text):
            assert time.monotonic() < deadline, standin.objects("pods")
            time.sleep(0.5)
        claimed = create(server.client)
        assert [pod_name(claimed)] == ready  # the warm pod became the session
        pod = standin.pod(pod_name(claimed))
        assert "deskbox.io/pool" not in pod["metadata"]["labels"]
        assert server.client.get(f"/v1/sessions/{claimed['id']}/screenshot").status_code == 200
        assert server.client.delete(f"/v1/sessions/{claimed['id']}").status_code == 204


def test_a_server_without_a_kubernetes_api_says_so(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    output = serve_refused(tmp_path / "state", {
        "DESKBOX_BACKENDS": "kubernetes", "DESKBOX_DEFAULT_BACKEND": "kubernetes",
        "DESKBOX_KUBERNETES_API": f"http://127.0.0.1:{port}",
        "DESKBOX_KUBERNETES_IMAGE": "deskbox-session:x"})
    assert f"the Kubernetes API at http://127.0.0.1:{port} does not answer" in output
