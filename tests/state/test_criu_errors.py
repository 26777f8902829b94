"""Where CRIU cannot work, the error names the cause (engines/runc/criu.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deskbox_server.engines.runc.archive import _failure
from deskbox_server.engines.runc.criu import Criu, _explain, _out_of_room
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.engines.runc.snapshot import take_snapshot
from deskbox_server.errors import InsufficientStorage


def test_missing_criu_says_how_to_install_it(tmp_path: Path) -> None:
    reason = Criu(tmp_path / "criu").missing()
    assert reason is not None and "scripts/criu.sh" in reason


def test_kernel_refusing_so_passcred_is_named(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(
        "(00.07) Error (criu/util.c:1533): rlimit: Can't setup RLIMIT_NOFILE for self\n"
        "(00.39) Error (criu/sockets.c:628): sockets: Can't get 1:16 opt: "
        "Operation not supported\n"
        "(00.48) Error (criu/cr-dump.c:2111): Dumping FAILED.\n"
    )
    message = _explain(log, b"")
    assert "SO_PASSCRED" in message and "6.16" in message


def test_a_host_connection_into_the_sandbox_is_named(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(
        "(00.26) Error (criu/sk-unix.c:351): unix: Unix socket 866285 not found\n"
        "(00.26) Error (criu/cr-dump.c:1681): Dump files (pid: 17413) failed with -1\n"
    )
    assert "outside it holds a connection" in _explain(log, b"")


def test_an_open_tcp_connection_is_named_without_criu_flags(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text(
        "(00.31) Error (criu/sk-inet.c:199): inet: Connected TCP socket, consider using "
        "--tcp-established option.\n"
        "(00.31) Error (criu/cr-dump.c:1681): Dump files (pid: 52) failed with -1\n"
    )
    message = _explain(log, b"")
    assert "open TCP connection" in message and "egress all or allowlist" in message
    assert "--tcp-established" not in message


def test_other_failures_quote_the_first_specific_error(tmp_path: Path) -> None:
    log = tmp_path / "dump.log"
    log.write_text("(00.1) Error (criu/x.c:1): something specific\n"
                   "(00.2) Error (criu/cr-dump.c:2111): Dumping FAILED.\n")
    assert _explain(log, b"").endswith("something specific")
    assert "runc said" in _explain(tmp_path / "missing.log", b"runc said")


def test_a_quota_met_is_no_room_as_a_full_disk_is(tmp_path: Path) -> None:
    """CRIU's or tar's EDQUOT where the file system itself has room: a 507, as QEMU's
    save that meets a quota was already (a dump's was a 422, an archive's a 502)."""
    log = tmp_path / "dump.log"
    log.write_text("(00.5) Error (criu/image.c:1): Unable to write: Disk quota exceeded\n")
    assert _out_of_room(tmp_path, log, b"")
    assert not _out_of_room(tmp_path, tmp_path / "missing.log", b"something else")
    said = b"tar: pages-1.img: Cannot write: Disk quota exceeded"
    assert isinstance(_failure("the checkpoint is corrupted", said, tmp_path),
                      InsufficientStorage)


def test_a_dump_with_no_room_for_its_images_is_insufficient_storage(
    sandbox: RuncSandbox, tmp_path: Path,
) -> None:
    """A fork's images on a scratch tmpfs that filled (several checkpoints chose it at
    once, each seeing room enough): a 507 the client may retry, not a 422 saying the
    sandbox cannot be checkpointed. The sandbox runs on."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "deskbox-tiny",
                    str(tiny)], check=True)
    try:
        with pytest.raises(InsufficientStorage, match="no room for the checkpoint"):
            take_snapshot(sandbox, Criu(), tiny / "fork", packed=False)
        assert sandbox.failure() is None
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
