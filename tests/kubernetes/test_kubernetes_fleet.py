"""Two server replicas, one cluster (``DESKBOX_REGISTRY=cluster``): session records and
tokens live in the cluster's Secrets (here the stand-in API server's), so that either
replica serves any session, as replicas behind one Service do. Each replica is a real
``deskbox serve`` with its own state dir; the session's pod is one real container whose
agent both reach over TCP.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.kubernetes.cluster import Cluster
from deskbox_server.engines.kubernetes.engine import KubernetesEngine, KubernetesOptions
from deskbox_server.engines.kubernetes.records import ClusterRecords
from deskbox_server.engines.kubernetes.spec import (
    PodLimits,
    network_policy_manifest,
    pod_manifest,
)

from ..api.containers import act, page_origin
from ..api.containers import create_running as create
from ..api.helpers import assert_error, decode
from ..api.sandbox_page import SandboxPage, events_data_url
from ..api.served import serve_refused
from .conftest import NAMESPACE, StandIn
from .test_kubernetes_sessions import Server, kubernetes_server, pod_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# A fleet of its own: the other tests' servers (fleet "deskbox") never sweep its pods.
FLEET = {"DESKBOX_REGISTRY": "cluster", "DESKBOX_KUBERNETES_FLEET": "fleet-test"}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


def replica(standin: StandIn, base: Path, name: str, **extra: str) -> Any:
    return kubernetes_server(standin, base / f"{name}-state", base / f"{name}.log",
                             DESKBOX_KUBERNETES_REPLICA=name, **FLEET, **extra)


@pytest.fixture(scope="module")
def one(standin: StandIn, base: Path) -> Iterator[Server]:
    with replica(standin, base, "one") as server:
        yield server


@pytest.fixture(scope="module")
def two(standin: StandIn, base: Path, one: Server) -> Iterator[Server]:
    with replica(standin, base, "two") as server:
        yield server


def state(server: Server, session: dict[str, Any]) -> str:
    response = server.client.get(f"/v1/sessions/{session['id']}")
    assert response.status_code == 200, response.text
    return str(response.json()["state"])


def until(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.2)


def test_a_session_made_on_one_replica_is_driven_through_the_other(
    one: Server, two: Server, standin: StandIn
) -> None:
    session = create(one.client, browser={"start_url": events_data_url()})
    assert two.client.get(f"/v1/sessions/{session['id']}").json()["state"] == "running"
    assert session["id"] in [s["id"] for s in two.client.get("/v1/sessions").json()["sessions"]]
    # The session's record and owner are in the cluster, where both replicas read them.
    assert f"{pod_name(session)}-record" in standin.names("secrets")

    shot = two.client.get(f"/v1/sessions/{session['id']}/screenshot")
    assert shot.status_code == 200, shot.text
    assert decode(shot.content).size == (1280, 800)
    with SandboxPage(two.client, session["id"]) as page:  # exec, through the second
        page.wait(lambda s: s["clicks"] == 0, timeout_s=30)
        x, y = page_origin(two.client, session, page)
        act(two.client, session, {"actions": [{"type": "click", "x": x + 900, "y": y + 175},
                                              {"type": "type", "text": "two"}]})
        act(one.client, session, {"type": "type", "text": " and one"})
        seen = page.wait(lambda s: s["value"] == "two and one", timeout_s=30)
    assert seen["value"] == "two and one"

    # A token issued through one replica opens the live view's status through the other;
    # revoked through the other, it opens nothing anywhere.
    issued = one.client.post(f"/v1/sessions/{session['id']}/tokens", json={"scope": "view"})
    assert issued.status_code == 201, issued.text
    token = issued.json()["token"]
    status = f"/v1/sessions/{session['id']}/view/status"
    for server in (two, one):
        opened = httpx.get(f"{server.client.base_url}{status}", params={"token": token})
        assert opened.status_code == 200, opened.text
        assert opened.json()["state"] == "running"
    revoked = two.client.delete(f"/v1/sessions/{session['id']}/tokens/{issued.json()['id']}")
    assert revoked.status_code == 204, revoked.text
    for server in (one, two):
        refused = httpx.get(f"{server.client.base_url}{status}", params={"token": token})
        assert_error(refused, 401, "unauthorized")

    # A delete through one replica ends it for both: stopped, not failed, and gone.
    assert two.client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert state(two, session) == "stopped"
    until(lambda: state(one, session) == "stopped")
    after = one.client.post(f"/v1/sessions/{session['id']}/actions",
                            json={"type": "move", "x": 5, "y": 5})
    assert_error(after, 404, "not_found")
    assert state(one, session) == "stopped"  # one's failed stream did not make it failed
    until(lambda: pod_name(session) not in standin.names("pods"))


def test_the_idle_clock_counts_requests_through_every_replica(
    one: Server, two: Server, standin: StandIn
) -> None:
    session = create(one.client, timeout_s=4)
    # Driven only through two for longer than its timeout: one, which made it, keeps it.
    until_s = time.monotonic() + 7
    while time.monotonic() < until_s:
        shot = two.client.get(f"/v1/sessions/{session['id']}/screenshot")
        assert shot.status_code == 200, shot.text
        time.sleep(0.5)
    assert state(one, session) == state(two, session) == "running"
    # Left alone, it is stopped (by either), and both say so.
    until(lambda: state(one, session) == state(two, session) == "stopped", timeout_s=30)
    until(lambda: pod_name(session) not in standin.names("pods"))


def test_a_replica_that_stops_leaves_its_sessions_to_the_others(
    one: Server, standin: StandIn, base: Path
) -> None:
    with replica(standin, base, "three") as three:
        session = create(three.client)
    # three stopped (SIGTERM): its session runs on, and one serves it.
    assert state(one, session) == "running"
    shot = one.client.get(f"/v1/sessions/{session['id']}/screenshot")
    assert shot.status_code == 200, shot.text
    assert pod_name(session) in standin.names("pods")
    assert one.client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert state(one, session) == "stopped"


def test_a_session_failed_for_the_fleet_leaves_no_pod(
    one: Server, two: Server, standin: StandIn
) -> None:
    """A replica that cannot take a session over (here: the agent's token is gone, as a
    pod it cannot reach) fails it for the fleet at a delete; its pod ran on held by no
    replica (the one that held it let go of a failed session), with its policy, for good."""
    session = create(one.client)
    name = pod_name(session)
    gone = httpx.delete(f"{standin.url}/api/v1/namespaces/{NAMESPACE}/secrets/{name}")
    assert gone.status_code == 200, gone.text
    assert two.client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert state(two, session) == "failed"
    until(lambda: state(one, session) == "failed")
    time.sleep(2)  # a few reaper passes of both
    left = [kind for kind in ("pods", "networkpolicies") if name in standin.names(kind)]
    for kind in left:
        prefix = "/apis/networking.k8s.io/v1" if kind == "networkpolicies" else "/api/v1"
        httpx.delete(f"{standin.url}{prefix}/namespaces/{NAMESPACE}/{kind}/{name}")
    assert not left, f"the failed session's objects stayed: {left}"


def labelled(standin: StandIn, plural: str, replica: str, warm: bool = False) -> list[str]:
    """The names of ``replica``'s objects of a kind (only its warm pods: ``warm``)."""
    return [o["metadata"]["name"] for o in standin.objects(plural)
            if o["metadata"].get("labels", {}).get("deskbox.io/replica") == replica
            and (not warm or o["metadata"]["labels"].get("deskbox.io/pool") == "warm")]


def test_what_a_killed_replica_left_is_removed_by_another(
    standin: StandIn, base: Path
) -> None:
    """A replica killed outright leaves its warm pod (with its policy), and a policy whose
    delete the API server refused (made here by hand, of no pod): no replica removed
    another's, as it cannot tell a dead replica's from a live one's, so they stayed for
    good. Each replica now renews a Lease (here every third of 1 s): another removes
    what a replica whose Lease stopped moving left, then its Lease; never while it lives,
    nor a session's pod (one claimed whose warm label stayed: the fleet has its record)."""
    lease = {"DESKBOX_KUBERNETES_LEASE_S": "1"}
    stray = {"name": "deskbox-ses-strayed", "labels": {
        "deskbox.io/fleet": "fleet-test", "deskbox.io/session": "ses_strayed",
        "deskbox.io/replica": "doomed"}}
    claimed = {"name": "deskbox-ses-claimedwarm", "labels": {
        "deskbox.io/fleet": "fleet-test", "deskbox.io/session": "ses_claimedwarm",
        "deskbox.io/replica": "doomed", "deskbox.io/pool": "warm"}}
    core = f"{standin.url}/api/v1/namespaces/{NAMESPACE}"
    policies = f"{standin.url}/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies"
    leases = f"{standin.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    try:
        with replica(standin, base, "doomed", DESKBOX_POOL_SIZE="1", **lease) as doomed:
            until(lambda: bool(labelled(standin, "pods", "doomed", warm=True)), 120)
            assert httpx.post(policies, json={"metadata": stray, "spec": {"podSelector": {}}}
                              ).status_code == 201
            assert httpx.post(f"{core}/pods", json={"metadata": claimed, "spec": {
                "containers": [{"name": "desktop", "image": "registry.invalid/nothing:1"}]}}
                              ).status_code == 201
            assert httpx.post(f"{core}/secrets", json={"metadata": {
                "name": "deskbox-ses-claimedwarm-record", "labels": {
                    "app.kubernetes.io/name": "deskbox-record",
                    "deskbox.io/fleet": "fleet-test",
                    "deskbox.io/session": "ses_claimedwarm"}},
                "data": {"record": "e30="}}).status_code == 201
            with replica(standin, base, "judge", **lease):
                time.sleep(4)  # past three of the doomed replica's lease durations
                assert labelled(standin, "pods", "doomed", warm=True), "a live one's swept"
                assert stray["name"] in labelled(standin, "networkpolicies", "doomed")
                doomed.process.send_signal(signal.SIGKILL)
                doomed.process.wait()
                until(lambda: labelled(standin, "pods", "doomed") == [claimed["name"]]
                      and not labelled(standin, "networkpolicies", "doomed"))
                # Its Lease went last; the judge's own is renewed.
                until(lambda: "deskbox-fleet-test.doomed" not in standin.names("leases"))
                assert "deskbox-fleet-test.judge" in standin.names("leases")
    finally:
        httpx.delete(f"{policies}/{stray['name']}")
        httpx.delete(f"{core}/pods/{claimed['name']}")
        httpx.delete(f"{core}/secrets/deskbox-ses-claimedwarm-record")
        for name in ("doomed", "judge"):
            httpx.delete(f"{leases}/deskbox-fleet-test.{name}")


def test_a_replica_that_cannot_renew_its_lease_makes_no_pod(
    standin: StandIn, base: Path
) -> None:
    """Its Lease stale, the others may soon take it for dead and remove what it makes: a
    pod's policy among them, and with it the pod's confinement."""
    leases = f"{standin.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
    try:
        with replica(standin, base, "fenced", DESKBOX_KUBERNETES_LEASE_S="1") as fenced:
            armed = httpx.post(f"{standin.url}/standin/fail", json={
                "method": "PATCH", "plural": "leases", "name": "deskbox-fleet-test.fenced",
                "status": 503, "times": 1000})
            assert armed.status_code == 200, armed.text
            time.sleep(1.5)
            refused = fenced.client.post("/v1/sessions", json={})
            message = assert_error(refused, 502, "session_failed")["message"]
            assert "could not renew its lease" in message
            assert not labelled(standin, "pods", "fenced")
            assert not labelled(standin, "networkpolicies", "fenced")
    finally:
        httpx.delete(f"{standin.url}/standin/fail")
        httpx.delete(f"{leases}/deskbox-fleet-test.fenced")


def test_what_one_server_keeps_is_refused_in_a_fleet(one: Server, two: Server) -> None:
    refused = one.client.post("/v1/sessions", json={"record": True})
    assert_error(refused, 422, "invalid_request")
    assert "DESKBOX_REGISTRY=cluster" in refused.json()["error"]["message"]
    session = create(one.client)
    try:
        for path, body in (("recording/start", None), ("control", {})):
            answer = two.client.post(f"/v1/sessions/{session['id']}/{path}", json=body)
            assert_error(answer, 422, "invalid_request")
    finally:
        assert two.client.delete(f"/v1/sessions/{session['id']}").status_code == 204


def test_a_stored_secret_is_refused_in_a_fleet(one: Server, two: Server) -> None:
    """A secret is kept encrypted in one server's state dir, under that server's key: one
    stored through one replica was 404 through the other (typing it there too)."""
    stored = one.client.post("/v1/secrets", json={
        "name": "FLEET_PASSWORD", "value": "hunter2-fleet",
        "allowed_origins": ["https://example.com"]})
    if stored.status_code == 201:
        one.client.delete("/v1/secrets/FLEET_PASSWORD")
    message = assert_error(stored, 422, "invalid_request")["message"]
    assert "DESKBOX_REGISTRY=cluster" in message
    assert two.client.get("/v1/secrets").json() == {"secrets": []}


def test_a_cluster_registry_needs_the_kubernetes_engine(tmp_path: Path) -> None:
    output = serve_refused(tmp_path / "state", {
        "DESKBOX_REGISTRY": "cluster", "DESKBOX_BACKENDS": "local",
        "DESKBOX_DEFAULT_BACKEND": "local"})
    assert "DESKBOX_REGISTRY=cluster needs the kubernetes backend" in output


async def test_a_record_written_over_a_newer_one_is_refused(standin: StandIn) -> None:
    """The idle clock's push (fleet.py) writes only over the record it read: a state change
    another replica made since wins."""
    cluster = Cluster(standin.url, NAMESPACE)
    await cluster.open()
    records = ClusterRecords(cluster, "fleet-unit")
    try:
        await records.put("ses_0f0f", "key_a", True, '{"clock": 1}')
        read = await records.read("ses_0f0f")
        assert read is not None and read.version
        await records.put("ses_0f0f", "key_a", False, '{"state": "stopping"}')  # another's
        assert not await records.put_if("ses_0f0f", True, '{"clock": 2}', read.version)
        now = await records.read("ses_0f0f")
        assert now is not None and now.record == '{"state": "stopping"}'
        assert [e.session_id for e in await records.ended()] == ["ses_0f0f"]
        assert await records.put_if("ses_0f0f", True, '{"clock": 3}', now.version)
        # Its liveness is written with it: the fleet lists it by that.
        assert [e.session_id for e in await records.live()] == ["ses_0f0f"]
    finally:
        await records.delete("ses_0f0f")
        await cluster.close()


async def test_a_pod_a_killed_start_left_half_made_is_removed(standin: StandIn) -> None:
    """What a replica killed mid-start leaves: a policy and a pod that never runs (its image
    cannot be pulled), no Secret. Nothing there can be adopted; the fleet's reaper, which
    ends such a session (sessions/fleet.py), still removes all of it."""
    engine = KubernetesEngine(KubernetesOptions(
        api=standin.url, namespace=NAMESPACE, image="registry.invalid/nothing:1",
        fleet="fleet-unit"))
    await engine.prepare()
    name = "deskbox-ses-halfmade"
    try:
        await engine.cluster.create_network_policy(
            network_policy_manifest(engine.pods, "ses_halfmade", []))
        await engine.cluster.create_pod(
            pod_manifest(engine.pods, "ses_halfmade", DesktopSpec(), PodLimits()))
        assert name in standin.names("pods") and name in standin.names("networkpolicies")
        await engine.remove_left("ses_halfmade")
        assert name not in standin.names("pods")
        assert name not in standin.names("networkpolicies")
    finally:
        await engine.cluster.delete_pod(name)
        await engine.cluster.delete_network_policy(name)
        await engine.close()
