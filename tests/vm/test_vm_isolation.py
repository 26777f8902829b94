"""The isolation battery against VM sessions, seen from inside the guest as the session's
own programs would look: no host file, no host process, no way to the control plane.

The container engine's battery (tests/isolation/) looks at a runc sandbox's namespaces; a
VM's boundary is its kernel and QEMU, so here the same questions are asked of the guest
(the package's two VMs: ``vm.session`` with no NIC, ``vm.allowlisted`` with one). Egress
rules themselves are test_vm_network.py's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..peer_network import PROBE, HostServices, Peer, host_targets
from .conftest import Vm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# virtio device ids (virtio spec 1.2, 5): what a VM with a shared host directory would have.
VIRTIO_NET, VIRTIO_BLOCK, VIRTIO_CONSOLE, VIRTIO_9P, VIRTIO_FS = 1, 2, 3, 9, 26
SHARED_FILESYSTEMS = {"9p", "virtiofs", "nfs", "nfs4", "cifs", "fuse", "overlay"}


def run(client: httpx.Client, session: dict[str, Any], script: str, *args: str) -> str:
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["sh", "-c", script, "sh", *args], "timeout_s": 120})
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["exit_code"] == 0, result
    return str(result["stdout"])


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host file with a name no guest could have made up."""
    path = tmp_path_factory.mktemp("host") / f"deskbox-host-marker-{os.getpid()}"
    path.write_text("host secret\n")
    return path


@pytest.mark.parametrize("name", ["session", "allowlisted"])
def test_the_guest_sees_no_host_file(vm: Vm, marker: Path, name: str) -> None:
    session = getattr(vm, name)
    found = run(vm.client, session, f"""
        for d in /sys/bus/virtio/devices/*; do echo "device $(cat $d/device)"; done
        while read -r source target type rest; do echo "mount $type $target"; done < /proc/mounts
        echo "blocks $(ls /sys/block | tr '\\n' ' ')"
        find / -xdev -name '{marker.name}' 2>/dev/null | sed 's/^/marker /'
        for d in /tmp /run /home /root /dev/shm; do
            find "$d" -name '{marker.name}' 2>/dev/null | sed 's/^/marker /'
        done
        echo "host state $(ls {vm.state_dir} 2>&1 | head -1)"
    """)
    lines = found.splitlines()
    devices = {int(line.split()[1], 16) for line in lines if line.startswith("device ")}
    expected = {VIRTIO_BLOCK, VIRTIO_CONSOLE} | ({VIRTIO_NET} if name == "allowlisted" else set())
    assert devices == expected, lines  # no 9p, no virtio-fs: nothing of the host is shared
    mounts = [line.split()[1:] for line in lines if line.startswith("mount ")]
    assert not {kind for kind, _ in mounts} & SHARED_FILESYSTEMS, mounts
    assert ["erofs", "/"] in mounts  # the read-only session image, on the guest's own disk
    assert next(line for line in lines if line.startswith("blocks ")).split()[1:] == ["vda"]
    assert not [line for line in lines if line.startswith("marker ")], lines
    assert "No such file or directory" in next(
        line for line in lines if line.startswith("host state "))


def test_the_guest_sees_no_host_process(vm: Vm) -> None:
    names = run(vm.client, vm.session,
                "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null").split()
    assert "deskbox-session" in names and "Xvfb" in names
    # The server, the test runner and QEMU itself run on the host, out of the guest's sight.
    host_only = {"deskbox", "pytest", "qemu-system-x86", "python"}
    assert not host_only & set(names), names
    assert len(names) < 120  # the guest's kernel threads and the session, nothing else


def test_the_control_plane_is_unreachable_from_the_guest(
    vm: Vm, peer: Peer, host_services: HostServices
) -> None:
    """From the VM with a NIC: the server's port on the host, on every host address and on
    the session namespace's loopback (QEMU's 10.0.2.2), and the host's other services."""
    port = vm.client.base_url.port
    assert port is not None
    targets = [f"127.0.0.1:{port}", f"10.0.2.2:{port}", f"{peer.host_side}:{port}",
               *host_targets(host_services, peer)]
    found: dict[str, list[object]] = json.loads(run(
        vm.client, vm.allowlisted, 'exec python3 -c "$1" "$2"', PROBE, json.dumps(targets)))
    for target, outcome in found.items():
        assert outcome[0] != "ok", (target, outcome)
    assert set(found) == set(targets)
