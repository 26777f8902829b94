"""A VM's hibernation and snapshot when something else happens during them, without a
guest: the sandbox is made by hand, and its QEMU is a real one with no machine to run
(``-M none``: its QMP and its migration to a file are QEMU's own, and nothing boots) or a
stand-in at the seam the engine drives QEMU through (guest.py's VmGuest).

- The disk under the checkpoint is full (a small tmpfs of the test's), or has no inode
  left for the new file: the call is a 507 ``insufficient_storage`` and the VM runs on as
  it was. It was a 502 that failed the session (QEMU's migration error), or a 500 (the
  file's open), though the guest had been resumed.
- QEMU's migration fails otherwise (its writes refused: a file-size limit on the test's
  QEMU): the call is a 422 naming QEMU's error, and the VM runs on. It was a 502 that
  failed the session.
- A delete does not wait for a hibernation: when it removes the VM (its directories too)
  after QEMU wrote the migration stream, the hibernation's next file is gone. That was a
  500; the delete came first, so the hibernation answers 409."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.engines.vm.guest import VmGuest, _connect_qmp
from deskbox_server.engines.vm.qemu import QEMU, VmConfig
from deskbox_server.engines.vm.sandbox import VmSandbox, runtime_root
from deskbox_server.errors import CheckpointUnavailable, Conflict, InsufficientStorage


def no_image(_: object) -> Path:
    raise AssertionError("no guest is booted here")


@contextlib.contextmanager
def small_disk(directory: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs of 16 inodes at ``directory``, unmounted at the end."""
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,nr_inodes=16,mode=0700",
                    "deskbox-full", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def fill_blocks(directory: Path) -> None:
    with (directory / "filler").open("wb", buffering=0) as filler:
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 4096)


def fill_inodes(directory: Path) -> None:
    with contextlib.suppress(OSError):
        for number in range(64):
            (directory / f"inode{number}").touch()


def made_by_hand(engine: VmEngine, session_id: str) -> VmSandbox:
    """A sandbox's files as a boot leaves them: its state directory with its vm.json, its
    runtime directory, its cgroup at its CPU quota (a save lifts it meanwhile; the engine's
    destroy removes it)."""
    sandbox = VmSandbox(engine.state_dir, 8, session_id, VmConfig())
    sandbox.state_dir.mkdir(parents=True)
    (sandbox.state_dir / "vm.json").write_text(sandbox.config.to_json())
    sandbox.paths.runtime.mkdir(parents=True)
    sandbox.cgroup.create(sandbox.config.cpu_quota, sandbox.config.cgroup_memory_bytes)
    return sandbox


def qemu_without_guest(
    sandbox: VmSandbox, file_limit: int | None = None
) -> subprocess.Popen[bytes]:
    """``file_limit``: QEMU may write files up to that many bytes; a write beyond is
    refused (EFBIG: SIGXFSZ is ignored, as it would kill QEMU instead)."""

    def limit_files() -> None:
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.Popen(
        [QEMU, "-M", "none", "-nodefaults", "-nographic",
         "-qmp", f"unix:{sandbox.paths.qmp},server=on,wait=off"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=limit_files)


async def runs_as_it_was(sandbox: VmSandbox, guest: VmGuest) -> None:
    assert sandbox.guest is guest and guest.failure() is None
    assert await guest.status() == "running"
    assert not await asyncio.to_thread(sandbox.hibernation_file.exists)


async def saves_onto_a_full_disk(engine: VmEngine, sandbox: VmSandbox,
                                 process: subprocess.Popen[bytes], disk: Path) -> None:
    guest = sandbox.guest = VmGuest(process.pid, sandbox.paths,
                                    await _connect_qmp(sandbox.paths, process, 30.0), process)
    try:
        await asyncio.to_thread(fill_blocks, disk)
        with pytest.raises(InsufficientStorage, match="No space left on device"):
            await engine.checkpoint(sandbox)
        await runs_as_it_was(sandbox, guest)

        snapshot = disk / "snapshot"
        with pytest.raises(InsufficientStorage, match="no room on the server's disk"):
            await engine.snapshot(sandbox, snapshot)
        assert not await asyncio.to_thread(snapshot.exists)
        await runs_as_it_was(sandbox, guest)

        await asyncio.to_thread(fill_inodes, disk)  # the file cannot even be made now
        with pytest.raises(InsufficientStorage, match="No space left on device"):
            await engine.checkpoint(sandbox)
        await runs_as_it_was(sandbox, guest)
    finally:
        await engine.destroy(sandbox)


def test_a_save_onto_a_full_disk_is_507_and_the_vm_runs_on(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        engine = VmEngine(disk / "state", no_image)
        sandbox = made_by_hand(engine, "ses_fulldisk")
        process = qemu_without_guest(sandbox)
        try:
            asyncio.run(saves_onto_a_full_disk(engine, sandbox, process, disk))
        finally:
            process.kill()
            process.wait()
            shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


async def saves_refused(engine: VmEngine, sandbox: VmSandbox,
                        process: subprocess.Popen[bytes]) -> None:
    guest = sandbox.guest = VmGuest(process.pid, sandbox.paths,
                                    await _connect_qmp(sandbox.paths, process, 30.0), process)
    try:
        with pytest.raises(CheckpointUnavailable,
                           match="QEMU could not save the VM: .*File too large"):
            await engine.checkpoint(sandbox)
        await runs_as_it_was(sandbox, guest)

        snapshot = engine.state_dir / "snapshot"
        with pytest.raises(CheckpointUnavailable, match="File too large"):
            await engine.snapshot(sandbox, snapshot)
        assert not await asyncio.to_thread(snapshot.exists)
        await runs_as_it_was(sandbox, guest)
    finally:
        await engine.destroy(sandbox)


def test_a_save_qemu_fails_is_422_and_the_vm_runs_on(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = made_by_hand(engine, "ses_savefails")
    process = qemu_without_guest(sandbox, file_limit=1)
    try:
        asyncio.run(saves_refused(engine, sandbox, process))
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


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
