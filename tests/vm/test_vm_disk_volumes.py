"""Volumes on a VM: each is a virtio-blk disk of its ext4 image (the descriptor opened by the
server: the jailed QEMU sees no volume file), mounted by the guest's /init where the session
asked, read-only or not; kept through a hibernation (QEMU's migration to a file and a new
QEMU, under another uid: a VM that started meanwhile took the first's). The server-level
rules (one writer, quotas, 422 for copies) are the engine-neutral ones of
tests/api/test_volumes.py.

Booted through the engine, without a browser, as test_vm_egress_all.py's guest; first in
the package by name, so that it boots beside the package's VMs rather than after them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from deskbox_server.agent import AgentLimits
from deskbox_server.agent.client import AgentClient, ExecChunk, ExecStatus
from deskbox_server.engines.base import SessionSpec, VolumeAttach
from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.engines.vm.sandbox import VmSandbox
from deskbox_server.engines.volumes import create_disk

from .conftest import BOOT_TIMEOUT_S, VmServers, qemu_pids, status_field, vm_guest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def run(agent: AgentClient, *argv: str) -> tuple[int, str]:
    out, status = bytearray(), None
    async for part in agent.exec(argv, timeout_s=120):
        if isinstance(part, ExecChunk):
            out += part.data
        elif isinstance(part, ExecStatus):
            status = part
    assert status is not None, argv
    return status.exit_code or 0, out.decode()


async def connect(engine: VmEngine, sandbox: VmSandbox) -> AgentClient:
    reader, writer = await engine.open_stream(sandbox, 1 << 18)
    # The engine's own handshake deadline: an emulated guest just restored can take more
    # than the default 5 s to answer on a busy host (seen once in a full run).
    limits = AgentLimits(handshake_timeout_s=engine.handshake_timeout_s)
    return await AgentClient.connect(reader, writer, limits)


def host_read(disk: Path, path: str) -> str:
    """A file of an ext4 image, read on the host without mounting it (e2fsprogs)."""
    return subprocess.run(["debugfs", "-R", f"cat {path}", str(disk)], capture_output=True,
                          text=True, check=True).stdout


async def test_volumes_are_disks_the_guest_mounts_and_keeps_through_a_hibernation(
    servers: VmServers,
) -> None:
    state = Path(tempfile.mkdtemp(prefix="deskbox-vm-volumes-"))
    work, reference = state / "work.ext4", state / "reference.ext4"
    for disk in (work, reference):
        create_disk(disk, 32)
    engine = VmEngine(state, lambda _cancel: vm_guest(), browser=False)
    await engine.prepare()
    spec = SessionSpec(id=f"ses_vmvolumes{os.getpid()}", volumes=(
        VolumeAttach("work", work, "/root/work"),
        VolumeAttach("reference", reference, "/tmp/reference", read_only=True)))
    sandbox = await engine.create(spec, BOOT_TIMEOUT_S)
    try:
        (qemu,) = qemu_pids(int(sandbox.paths.pid.read_text()))
        argv = await asyncio.to_thread(Path(f"/proc/{qemu}/cmdline").read_bytes)
        assert b"/dev/fdset/1" in argv and str(work).encode() not in argv
        agent = await connect(engine, sandbox)
        try:
            code, mounts = await run(agent, "cat", "/proc/mounts")
            assert code == 0
            mounted = {line.split()[1]: line.split() for line in mounts.splitlines()}
            assert mounted["/root/work"][2] == "ext4" and "rw" in mounted["/root/work"][3]
            assert mounted["/tmp/reference"][3].split(",")[0] == "ro"
            assert (await run(agent, "sh", "-c", "echo written in the guest > "
                              "/root/work/note && sync"))[0] == 0
            code, refused = await run(agent, "sh", "-c", "echo x > /tmp/reference/x")
            assert code != 0 and "Read-only file system" in refused
        finally:
            await agent.close()

        uid = status_field(qemu, "Uid").split()[0]
        await engine.checkpoint(sandbox)  # hibernate: QEMU ends, the disks stay attached
        assert qemu not in qemu_pids()
        # Another VM starts meanwhile and takes the uid the hibernation gave back: the
        # restore's QEMU runs as another, where the first one's files were.
        taken = engine._uids.take()
        assert str(taken) == uid
        try:
            await engine.restore(sandbox)
        finally:
            engine._uids.give_back(taken)
        (restored,) = qemu_pids(int(sandbox.paths.pid.read_text()))
        assert status_field(restored, "Uid").split()[0] != uid
        agent = await connect(engine, sandbox)
        try:
            assert await run(agent, "sh", "-c", "cat /root/work/note && echo more >> "
                             "/root/work/note && sync") == (0, "written in the guest\n")
        finally:
            await agent.close()
    finally:
        await engine.destroy(sandbox)
        await engine.close()
    assert host_read(work, "/note") == "written in the guest\nmore\n"
    shutil.rmtree(state)
