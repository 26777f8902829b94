"""Egress ``all`` on a VM: the guest reaches both of the peer network's services and none of
the host's, through the same namespace, pasta and rules as the container engine's ``all``.

Nothing leaves this machine: the "outside world" is tests/peer_network.py's namespace, and
this guest runs no browser (``VmEngine(browser=False)``, as tests/isolation/test_network.py's
runc sandboxes), since a browser with the whole network open would talk to the internet on
its own. So it is booted through the engine, not the API: its agent is reached over the
engine's stream, as the session layer reaches it.

First in the package (by name), so that this guest boots beside the package's three VMs
(``servers`` starts them) instead of after them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from deskbox_server.agent.client import AgentClient, ExecChunk, ExecStatus
from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.network import NETNS_DIR
from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.schemas.sessions import Network

from ..peer_network import PROBE, HostServices, Peer, host_targets
from .conftest import BOOT_TIMEOUT_S, VmServers, qemu_pids, vm_guest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def run(agent: AgentClient, *argv: str) -> str:
    out, status = bytearray(), None
    async for part in agent.exec(argv, timeout_s=120):
        if isinstance(part, ExecChunk) and part.stream == "stdout":
            out += part.data
        elif isinstance(part, ExecStatus):
            status = part
    assert status is not None and status.exit_code == 0, (argv, status)
    return out.decode()


async def test_all_reaches_services_beyond_the_host_and_none_of_the_host(
    servers: VmServers, peer: Peer, host_services: HostServices
) -> None:
    state = Path(tempfile.mkdtemp(prefix="deskbox-vm-all-"))
    engine = VmEngine(state, lambda _cancel: vm_guest(), browser=False)
    await engine.prepare()
    spec = SessionSpec(id=f"ses_egressall{os.getpid()}", network=Network(egress="all"))
    sandbox = await engine.create(spec, BOOT_TIMEOUT_S)
    try:
        reader, writer = await engine.open_stream(sandbox, 1 << 18)
        agent = await AgentClient.connect(reader, writer)
        try:
            beyond = [f"{peer.allowed}:{peer.port}", f"{peer.other}:{peer.port}"]
            found = json.loads(await run(agent, "python3", "-c", PROBE, json.dumps(
                [*beyond, *host_targets(host_services, peer),
                 f"10.0.2.2:{host_services.any_port}"])))
            for target in beyond:
                assert found.pop(target)[:2] == ["ok", "ok"], (target, found)
            for target, outcome in found.items():  # the host's loopback and addresses
                assert outcome[0] != "ok", (target, outcome)
            # Names go to pasta's forwarder (the container engine's ``all``), not the host's.
            assert (await run(agent, "cat", "/etc/resolv.conf")).startswith(
                "nameserver 169.254.1.1")
            assert (await run(agent, "ls", "/sys/class/net")).split() == ["eth0", "lo"]
            names = (await run(agent, "sh", "-c",
                               "for p in /proc/[0-9]*; do cat $p/comm; done")).split()
            assert "Xvfb" in names and "chromium" not in names
        finally:
            await agent.close()
        (netns,) = [p for p in NETNS_DIR.iterdir() if p.name.endswith(spec.id)]
        (qemu,) = [pid for pid in qemu_pids()
                   if os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns).st_ino]
    finally:
        await engine.destroy(sandbox)
        await engine.close()
    assert not netns.exists() and qemu not in qemu_pids()
    with contextlib.suppress(ChildProcessError):  # an orphan of its jail: this process reaps
        os.waitpid(qemu, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG: it never blocks)
    assert not list((state / "vm").iterdir())  # the session's own directory is gone
    shutil.rmtree(state)
