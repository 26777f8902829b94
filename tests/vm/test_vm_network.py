"""Egress ``allowlist`` on a VM session, through the API: the guest's NIC is QEMU's
user-mode network inside the session's host-made namespace, whose nftables rules (the
container engine's, tests/isolation/test_network.py) decide what it reaches.

Nothing leaves this machine: the "outside world" is the isolation tests' ``peer``
namespace on a veth. ``all`` is not run on a VM here: its session would run a browser with
the whole network open (the container engine's ``all`` is tested without one); it takes
the same path as ``allowlist`` with a rule set that admits more.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.network import NETNS_DIR, TABLE

from ..api.containers import container_server
from ..api.helpers import assert_error
from ..isolation.test_network import (
    _PROBE,
    HostServices,
    Peer,
    _host_targets,
    host_services,  # noqa: F401  (a fixture)
    peer,  # noqa: F401  (a fixture)
)
from .test_vm_sessions import qemu_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with container_server(tmp_path_factory, "vmnet", backends=["vm"], default_backend="vm",
                          desktop_call_timeout_s=60.0) as server, server.client() as http:
        http.timeout = httpx.Timeout(300.0)
        yield http


@pytest.fixture(scope="module")
def session(client: httpx.Client, peer: Peer) -> Iterator[dict[str, Any]]:  # noqa: F811
    response = client.post("/v1/sessions", json={
        "network": {"egress": "allowlist", "allow": [peer.allowed]}})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    try:
        yield body
    finally:
        client.delete(f"/v1/sessions/{body['id']}")


def run(client: httpx.Client, session: dict[str, Any], *argv: str) -> str:
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": list(argv), "timeout_s": 120})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


def probe(client: httpx.Client, session: dict[str, Any], *targets: str
          ) -> dict[str, list[object]]:
    found: dict[str, list[object]] = json.loads(
        run(client, session, "python3", "-c", _PROBE, json.dumps(targets)))
    return found


def test_allowlist_reaches_only_the_allowed_service(
    client: httpx.Client, session: dict[str, Any], peer: Peer,  # noqa: F811
) -> None:
    result = probe(client, session, f"{peer.allowed}:{peer.port}", f"{peer.other}:{peer.port}")
    assert result[f"{peer.allowed}:{peer.port}"][:2] == ["ok", "ok"], result
    refused = result[f"{peer.other}:{peer.port}"]
    assert refused[0] in ("ConnectionRefusedError", "ConnectionResetError"), result
    assert isinstance(refused[2], float) and refused[2] < 3.0  # refused, not left to time out
    # No name server: the guest's resolv.conf is the host's allowlist one.
    assert "nameserver" not in run(client, session, "cat", "/etc/resolv.conf")
    assert run(client, session, "ls", "/sys/class/net").split() == ["eth0", "lo"]


def test_the_host_and_its_loopback_are_unreachable(
    client: httpx.Client, session: dict[str, Any], peer: Peer,  # noqa: F811
    host_services: HostServices,  # noqa: F811
) -> None:
    # From the guest, 10.0.2.2 is QEMU's side of its user network: the loopback of the
    # session's namespace, not the host's.
    targets = [*_host_targets(host_services, peer), f"10.0.2.2:{host_services.any_port}"]
    result = probe(client, session, *targets)
    for target, outcome in result.items():
        assert outcome[0] != "ok", (target, outcome)


def test_snapshots_and_forks_need_egress_none(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    for path, body in (("snapshots", {}), ("fork", {"count": 1})):
        error = assert_error(client.post(f"/v1/sessions/{session['id']}/{path}", json=body),
                             422, "invalid_request")
        assert 'egress "none"' in error["message"]
    response = client.get(f"/v1/sessions/{session['id']}")
    assert response.json()["state"] == "running"  # the refusal left it running


def test_qemu_runs_in_the_sessions_namespace_and_delete_removes_it(
    client: httpx.Client, session: dict[str, Any],
) -> None:
    (netns,) = [p for p in NETNS_DIR.iterdir() if p.name.endswith(session["id"])]
    (qemu,) = [pid for pid in qemu_pids() if
               os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns).st_ino]
    assert Path(f"/proc/{qemu}/cmdline").read_bytes().count(b"virtio-net-device") == 1
    rules = subprocess.run(["nsenter", f"--net={netns}", "nft", "list", "table", "inet", TABLE],
                           capture_output=True, text=True, check=True).stdout
    assert "policy drop" in rules
    assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert not netns.exists() and qemu not in qemu_pids()
