"""A VM's hibernation when something else happens during it, without a guest: the sandbox is
made by hand, and its QEMU is a stand-in at the seam the engine drives it through
(guest.py's VmGuest).

A delete does not wait for a hibernation: when it removes the VM (its directories too)
after QEMU wrote the migration stream, the hibernation's next file is gone. That was a 500;
the delete came first, so the hibernation answers 409."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.engines.vm.guest import VmGuest
from deskbox_server.engines.vm.qemu import VmConfig
from deskbox_server.engines.vm.sandbox import VmSandbox, runtime_root
from deskbox_server.errors import Conflict


def no_image(_: object) -> Path:
    raise AssertionError("no guest is booted here")


class _OvertakenByADelete(VmGuest):
    """A QEMU whose save the session's delete overtakes: the stream is written, then the
    delete destroys the VM before the hibernation's last steps."""

    engine: VmEngine
    sandbox: VmSandbox

    async def save(self, path: Path, timeout_s: float) -> int:
        await asyncio.to_thread(path.write_bytes, b"QEVM")  # what QEMU's migration writes first
        self.timings["save"] = 0.0
        await self.engine.destroy(self.sandbox)
        return 4

    async def stop(self) -> None:
        pass  # no process: nothing to kill


def test_a_hibernation_a_delete_overtook_is_a_conflict(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = VmSandbox(engine.state_dir, 8, "ses_hibernatedelete", VmConfig())
    sandbox.state_dir.mkdir(parents=True)
    sandbox.paths.runtime.mkdir(parents=True)
    guest = _OvertakenByADelete(0, sandbox.paths, qmp=None)  # type: ignore[arg-type]
    guest.engine, guest.sandbox, sandbox.guest = engine, sandbox, guest
    try:
        with pytest.raises(Conflict, match="removed while it was saved"):
            asyncio.run(engine.checkpoint(sandbox))
        assert not sandbox.state_dir.exists() and not sandbox.paths.runtime.exists()
    finally:
        asyncio.run(engine.destroy(sandbox))
        runtime_root(engine.state_dir).rmdir()
