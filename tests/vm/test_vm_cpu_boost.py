"""A VM at a small ``resources.cpus`` boots at the host's full CPU and runs at its own quota
once its desktop is ready, and again after a restore.

QEMU's cgroup had the session's quota from QEMU's start: a guest at cpus 0.1 did not paint
within its start's timeout (a 502 after 185 s), and at 0.02 a guest without a browser does
not boot in it either. A restore or a save (a snapshot, whose guest runs on) is made at the
host's full CPU too, until the guest's agent answers again: at 0.02 it did not within the
handshake's 30 s. The guest here runs at the least cpus the engine takes under TCG (0.25;
it was 0.02 before that floor, which the API now refuses), so the boost is seen in its
cgroup, not inferred from a start that would fail without it. The guest has no browser
(``VmEngine(browser=False)``, as test_vm_egress_all.py's): it boots in seconds of CPU, not
a minute. Its start and resume take the session layer's Desktop's steps, as the server's
do, beside the package's VMs (``servers``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.vm.engine import TCG_FLOOR, VmEngine
from deskbox_server.schemas.sessions import Resources
from deskbox_server.sessions.desktop import Desktop

from .conftest import VmServers, quota_us, vm_guest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CPUS = TCG_FLOOR.cpus
QUOTA_US = 25_000  # of a 100 ms period


async def test_a_small_cpus_vm_starts_and_runs_at_its_quota_after_each_restore(
    servers: VmServers,
) -> None:
    state = Path(tempfile.mkdtemp(prefix="deskbox-vm-boost-"))
    engine = VmEngine(state, lambda _cancel: vm_guest(), browser=False)
    await engine.prepare()
    # The least start timeout a server gives a VM (the engine's floor).
    timeout_s = engine.start_timeout(0)
    spec = SessionSpec(id=f"ses_cpuboost{os.getpid()}", resources=Resources(cpus=CPUS))
    # Desktop.start's steps, with a desktop that has no browser window to wait for.
    desktop = Desktop(engine, await engine.create(spec, timeout_s))
    try:
        await desktop.connect()
        await desktop.desktop.ready(False, timeout_s)
        assert quota_us(desktop.sandbox.cgroup) is None  # booted at the host's full CPU
        await engine.started(desktop.sandbox, timeout_s)
        assert quota_us(desktop.sandbox.cgroup) == QUOTA_US

        # Desktop.restore's steps: the restored guest runs at the host's full CPU until
        # its agent answers again. The copies of a snapshot or fork take the same way back
        # to their quota: test_vm_sessions.py checks them at the default cpus, without a
        # boot of their own.
        await desktop.hibernate()
        await engine.restore(desktop.sandbox)
        assert quota_us(desktop.sandbox.cgroup) is None
        await desktop.connect()
        await engine.started(desktop.sandbox, timeout_s)
        assert quota_us(desktop.sandbox.cgroup) == QUOTA_US
    finally:
        with contextlib.suppress(Exception):
            await desktop.destroy()
        await engine.close()
        shutil.rmtree(state, ignore_errors=True)
