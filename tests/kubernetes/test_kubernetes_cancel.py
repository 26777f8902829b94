"""A create cancelled midway, by a delete of the starting session, leaves no object in the
cluster: an API server makes what it was asked for once the request reached it, also
after the server stopped waiting for the answer.

The stand-in holds one create of a kind for a moment (``POST /standin/hold``, standin.py)
and makes the object then, whether its client still waits or not, as a busy API server
does. The server, its engine and its clean-up are the real ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from ..scratch import scratch_dir
from .conftest import NAMESPACE, StandIn
from .test_kubernetes_sessions import Server, kubernetes_server, pod_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOLD_S = 1.5


@pytest.fixture(scope="module")
def server(standin: StandIn, request: pytest.FixtureRequest) -> Iterator[Server]:
    base = scratch_dir(request, "deskbox-kubernetes-cancel-")
    with kubernetes_server(standin, base / "state", base / "server.log") as running:
        yield running


def holding(standin: StandIn, plural: str) -> bool:
    return plural in standin.get("/standin/hold")["holding"]


@pytest.mark.parametrize("plural", ["networkpolicies", "pods", "secrets"])
def test_a_delete_while_the_api_server_makes_an_object_leaves_none(
    server: Server, standin: StandIn, plural: str
) -> None:
    """A delete that came while the API server was still to make the session's policy,
    pod or Secret cancelled the request, found nothing of that name to delete, and
    answered; the API server made the object after, for good (a pod ran unowned until a
    server's next start swept it)."""
    armed = httpx.post(f"{standin.url}/standin/hold",
                       json={"plural": plural, "seconds": HOLD_S}, timeout=10)
    assert armed.status_code == 200, armed.text
    made = server.client.post("/v1/sessions", params={"wait": "false"}, json={})
    assert made.status_code == 201, made.text
    session = made.json()
    deadline = time.monotonic() + 60
    while not holding(standin, plural):
        assert time.monotonic() < deadline, "the server never asked for the object"
        time.sleep(0.05)
    held_at = time.monotonic()
    assert server.client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    name = pod_name(session)
    # What the API server makes once it goes on with the create.
    time.sleep(max(0.0, held_at + HOLD_S + 1.5 - time.monotonic()))
    left = {kind: name for kind in ("networkpolicies", "pods", "secrets")
            if name in standin.names(kind)}
    for kind in left:
        prefix = "/apis/networking.k8s.io/v1" if kind == "networkpolicies" else "/api/v1"
        httpx.delete(f"{standin.url}{prefix}/namespaces/{NAMESPACE}/{kind}/{name}")
    assert not left, f"the session's objects outlived its delete: {left}"
    assert server.client.get(f"/v1/sessions/{session['id']}").json()["state"] == "stopped"
