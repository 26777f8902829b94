"""A VM whose cgroup would not go away (a QEMU thread stuck in the kernel; here a child
group nobody removes) still loses everything else at its destroy: the destroy skipped its
network, its disk and its directories, and nothing removed them again. Its runtime
directory alone stays, so that the next server's removal of orphans tries once more; the
VM's uid is not handed to another VM meanwhile. And a server's start, whose sweep of
orphans meets such a VM, logs it and goes on to the next (the start stopped on it, every
time). No guest boots: the sandbox is made by hand, as far as a destroy reaches."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import pytest

from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.engines.vm.qemu import VmConfig
from deskbox_server.engines.vm.sandbox import VmSandbox, runtime_root
from deskbox_server.errors import SessionFailed


def no_image(_: object) -> Path:
    raise AssertionError("no guest is booted here")


def held_cgroup(sandbox: VmSandbox) -> list[Path]:
    """The VM's cgroup, made, with a child group in each directory: it cannot be removed
    (as one whose QEMU thread is stuck in the kernel); the children's paths."""
    sandbox.cgroup.create(1.0, 256 * 1024 * 1024)
    blockers = [directory / "held" for directory in sandbox.cgroup.directories]
    for blocker in blockers:
        blocker.mkdir()
    return blockers


def let_go(sandbox: VmSandbox) -> None:
    """Remove the children :func:`held_cgroup` made, then the VM's cgroup."""
    for directory in sandbox.cgroup.directories:
        if (directory / "held").is_dir():
            (directory / "held").rmdir()
    sandbox.cgroup.remove()


def test_a_cgroup_that_stays_leaves_only_what_finds_the_vm_again(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = VmSandbox(engine.state_dir, 8, "ses_stuckgroup", VmConfig())
    sandbox.paths.runtime.mkdir(parents=True)
    sandbox.state_dir.mkdir(parents=True)
    (sandbox.state_dir / "disk.img").write_bytes(b"\0" * 4096)
    try:
        blockers = held_cgroup(sandbox)
        sandbox.uid = 4242

        with pytest.raises(SessionFailed, match="cgroup .* would not go away"):
            asyncio.run(engine.destroy(sandbox))
        assert not sandbox.state_dir.exists()  # the disk went
        assert sandbox.paths.runtime.is_dir()  # what the next server's sweep looks for
        assert sandbox.uid == 4242  # kept: QEMU may still run as it

        for blocker in blockers:
            blocker.rmdir()
        assert asyncio.run(engine.remove_orphans(())) == ["ses_stuckgroup"]
        assert not sandbox.paths.runtime.exists()
        assert not any(directory.exists() for directory in sandbox.cgroup.directories)
    finally:
        let_go(sandbox)
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


def test_an_orphan_that_stays_is_logged_and_the_sweep_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    stuck = VmSandbox(engine.state_dir, 8, "ses_a_stuck", VmConfig())
    gone = VmSandbox(engine.state_dir, 8, "ses_b_gone", VmConfig())
    for orphan in (stuck, gone):
        orphan.paths.runtime.mkdir(parents=True)
    try:
        held_cgroup(stuck)
        with caplog.at_level(logging.WARNING, logger="deskbox.vm"):
            assert asyncio.run(engine.remove_orphans(())) == ["ses_b_gone"]
        assert not gone.paths.runtime.exists()
        assert stuck.paths.runtime.is_dir()  # the next start tries again
        (warning,) = [r.getMessage() for r in caplog.records if "ses_a_stuck" in r.getMessage()]
        assert "not removed" in warning and "would not go away" in warning
    finally:
        let_go(stuck)
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)
