"""What QEMU's user leaves in its VM's runtime directory does not lead the server (root) to a
host file or socket, nor hang it.

QEMU runs as a user of its own that owns that directory: a QEMU its guest subverted can
replace any name there. The server wrote its pid file and QEMU's log through a symbolic
link put at their names (a host file overwritten), read a FIFO put there (a server start,
or a session's failure message, hung for good), and connected to a link at a socket's
name (a host socket of root's, spoken to as QMP or as the agent).

And a restore runs its QEMU under whichever uid is free then (the hibernated VM's went
back to the pool): that QEMU must be able to make its files, its console's among them,
where the previous QEMU left its own. The restore failed the session when another VM had
taken the uid meanwhile (test_vm_disk_volumes.py shows it on a real guest).

The guest's console is a file there (``-serial file:``), which the guest's root can write
to for good: the directory is a small tmpfs of the VM's own, not the host's /run.

No guest boots: the sandboxes are made by hand, and "QEMU" is a shell that exits at once
(its start fails as a real one's would, and the failure's message reads the logs), a
process that stands for QEMU's jail, or nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from deskbox_server.engines.vm.accel import Accelerator
from deskbox_server.engines.vm.engine import VmEngine, _prepare_host_side
from deskbox_server.engines.vm.guest import VmGuest, start_guest
from deskbox_server.engines.vm.jail import FIRST_UID
from deskbox_server.engines.vm.qemu import GuestImage, VmConfig, VmPaths, qemu_argv
from deskbox_server.engines.vm.runtime_files import RUNTIME_MB
from deskbox_server.engines.vm.sandbox import VmSandbox, runtime_root
from deskbox_server.errors import DesktopFailed, SessionFailed

T = TypeVar("T")
HANG_S = 20.0  # a call that takes longer is stuck (on a FIFO)


def no_image(_: object) -> Path:
    raise AssertionError("no guest is booted here")


def within(seconds: float, call: Callable[[], T], fifos: list[Path]) -> T:
    """``call()``'s result; AssertionError if it has not returned within ``seconds`` (it
    is then let go: the FIFOs it may wait on get a writer that closes at once)."""
    outcome: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 (handed to the test's thread)
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    stuck = thread.is_alive()
    for fifo in fifos:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    thread.join()
    assert not stuck, f"the server hung for over {seconds:.0f} s on what QEMU's user left"
    if errors:
        raise errors[0]
    return outcome[0]


@contextlib.contextmanager
def host_socket(path: Path) -> Iterator[list[str]]:
    """A unix socket of root's on the host, listening: the names of what connected."""
    connected: list[str] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            connected.append("a connection")
            connection.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield connected
    finally:
        stop.set()
        thread.join()
        listener.close()


def plant(runtime: Path, victims: Path) -> dict[Path, bytes]:
    """QEMU's user's work: links to host files at the server's own names and a FIFO at the
    console's. The host files and what they hold."""
    victims.mkdir()
    held = {}
    for name in ("qemu.pid", "qemu.log", "fw_cfg.env"):
        victim = victims / name
        victim.write_bytes(f"a host file of root's, not {name}\n".encode())
        held[victim] = victim.read_bytes()
        (runtime / name).symlink_to(victim)
    os.mkfifo(runtime / "console.log")
    return held


def test_a_start_writes_through_no_link_and_reads_no_fifo(tmp_path: Path) -> None:
    paths = VmPaths(tmp_path / "runtime")
    paths.runtime.mkdir()
    held = plant(paths.runtime, tmp_path / "host")
    qemu = ["sh", "-c", "echo 'qemu: could not load kernel' >&2; exit 1", "--"]

    def start() -> None:
        asyncio.run(start_guest(
            GuestImage(tmp_path / "guest"), VmConfig(), paths,
            Accelerator("tcg", "software emulation (TCG), as configured"), {}, 10.0,
            wrap=qemu))

    with pytest.raises(SessionFailed, match="exited with 1 at its start") as failed:
        within(HANG_S, start, [paths.console])
    # QEMU's log is the server's again, and tells why it stopped.
    assert "qemu.log: qemu: could not load kernel" in str(failed.value)
    for victim, content in held.items():
        assert victim.read_bytes() == content, victim
    for own in (paths.pid, paths.qemu_log, paths.fw_cfg("env")):
        assert not own.is_symlink() and own.stat().st_uid == 0
    assert int(paths.pid.read_text()) > 1


def test_a_server_start_sweeps_a_vm_whose_pid_file_is_a_fifo(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = VmSandbox(engine.state_dir, 8, "ses_fifopid", VmConfig())
    sandbox.paths.runtime.mkdir(parents=True)
    os.mkfifo(sandbox.paths.pid)
    try:
        removed = within(HANG_S, lambda: asyncio.run(engine.remove_orphans(())),
                         [sandbox.paths.pid])
        assert removed == ["ses_fifopid"] and not sandbox.paths.runtime.exists()
    finally:
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


class _Events:
    """QMP's event count, all that opening an agent stream asks of it."""

    def event_mark(self) -> int:
        return 0


def test_the_server_connects_to_no_socket_qemu_s_user_linked(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    engine.handshake_timeout_s = 2.0
    sandbox = VmSandbox(engine.state_dir, 8, "ses_linkedsockets", VmConfig())
    sandbox.state_dir.mkdir(parents=True)
    (sandbox.state_dir / "vm.json").write_text(sandbox.config.to_json())
    sandbox.paths.runtime.mkdir(parents=True)
    # Stands for the QEMU a previous server left (its jail's command line names the
    # runtime directory), so that a takeover goes on to QMP.
    leader = subprocess.Popen(["sh", "-c", "sleep 60", str(sandbox.paths.runtime)],
                              start_new_session=True)
    try:
        sandbox.paths.pid.write_text(f"{leader.pid}\n")
        with host_socket(tmp_path / "root.sock") as connected:
            for name in ("qmp.sock", "agent.sock"):
                (sandbox.paths.runtime / name).symlink_to(tmp_path / "root.sock")

            with pytest.raises(SessionFailed, match="cannot take over the VM: .*not a socket"):
                asyncio.run(engine.adopt(sandbox.session_id))

            sandbox.guest = VmGuest(leader.pid, sandbox.paths, _Events())  # type: ignore[arg-type]
            with pytest.raises(DesktopFailed, match="agent port: .*not a socket"):
                asyncio.run(engine.open_stream(sandbox, 1 << 16))
            assert connected == []
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


def as_user(uid: int, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``cwd`` as QEMU runs in its jail: that uid alone, no capability."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
         "--inh-caps=-all", "--bounding-set=-all", "--", *argv],
        capture_output=True, text=True, check=False, cwd=cwd)


def test_a_restore_under_another_uid_can_open_its_console(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = VmSandbox(engine.state_dir, 8, "ses_otheruid", VmConfig())
    first, then = FIRST_UID + 900_010, FIRST_UID + 900_011  # no live VM's
    try:
        _prepare_host_side(sandbox, first)
        written = as_user(first, "sh", "-c", "echo booted > console.log; : > qemu.sock",
                          cwd=sandbox.paths.runtime)
        assert written.returncode == 0, written.stderr
        sandbox.cgroup.remove()  # as kill() leaves it at a hibernation

        _prepare_host_side(sandbox, then)  # its uid was taken meanwhile
        opened = as_user(then, "sh", "-c", "echo restored > console.log",
                         cwd=sandbox.paths.runtime)
        assert opened.returncode == 0, opened.stderr
        assert sandbox.paths.console.read_text() == "restored\n"
        assert sandbox.paths.runtime.stat().st_uid == then
        assert sorted(p.name for p in sandbox.paths.runtime.iterdir()) == ["console.log"]
    finally:
        asyncio.run(engine.destroy(sandbox))
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)


def test_the_guest_s_console_cannot_fill_the_host_s_run(tmp_path: Path) -> None:
    engine = VmEngine(tmp_path / "state", no_image)
    sandbox = VmSandbox(engine.state_dir, 8, "ses_floodedconsole", VmConfig())
    uid = FIRST_UID + 900_001
    try:
        _prepare_host_side(sandbox, uid)
        argv = qemu_argv(GuestImage(tmp_path / "guest"), sandbox.config, sandbox.paths,
                         Accelerator("tcg", "software emulation (TCG), as configured"), ())
        assert f"file:{sandbox.paths.console}" in argv
        # The guest's root writing to /dev/ttyS0 for ever: QEMU appends it all.
        flood = as_user(uid, "dd", "if=/dev/zero", "of=console.log", "bs=1M", "count=64",
                        cwd=sandbox.paths.runtime)
        assert "No space left on device" in flood.stderr
        assert sandbox.paths.console.stat().st_size <= RUNTIME_MB << 20

        _prepare_host_side(sandbox, uid + 1)  # a restore: the same mount, emptied
        mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
        (mounted,) = [m for m in mounts if m[1] == str(sandbox.paths.runtime)]
        assert mounted[2] == "tmpfs" and f"size={RUNTIME_MB * 1024}k" in mounted[3]
        assert not any(sandbox.paths.runtime.iterdir())
    finally:
        asyncio.run(engine.destroy(sandbox))
        shutil.rmtree(runtime_root(engine.state_dir), ignore_errors=True)
    assert str(sandbox.paths.runtime) not in Path("/proc/self/mounts").read_text()
