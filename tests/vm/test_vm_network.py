"""Egress ``allowlist`` on a VM session, through the API: the guest's NIC is QEMU's
user-mode network inside the session's host-made namespace, whose nftables rules (the
container engine's, tests/isolation/test_network.py) decide what it reaches.

Nothing leaves this machine: the "outside world" is tests/peer_network.py's namespace on a
veth. ``all`` is test_vm_egress_all.py's, on a guest without a browser (one with the
whole network open would talk to the internet on its own).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.network import NETNS_DIR, TABLE

from ..api.helpers import assert_error
from ..peer_network import PROBE, HostServices, Peer, host_targets
from .conftest import Vm, qemu_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def client(vm: Vm) -> httpx.Client:
    return vm.client


@pytest.fixture
def session(vm: Vm) -> dict[str, Any]:
    return vm.allowlisted


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
        run(client, session, "python3", "-c", PROBE, json.dumps(targets)))
    return found


def test_allowlist_reaches_only_the_allowed_service(
    client: httpx.Client, session: dict[str, Any], peer: Peer
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
    client: httpx.Client, session: dict[str, Any], peer: Peer, host_services: HostServices
) -> None:
    # From the guest, 10.0.2.2 is QEMU's side of its user network: the loopback of the
    # session's namespace, not the host's.
    targets = [*host_targets(host_services, peer), f"10.0.2.2:{host_services.any_port}"]
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
