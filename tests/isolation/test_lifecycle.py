"""Destroying a sandbox leaves nothing behind; a dead sandbox is reported, not hidden."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from deskbox_server.engines.runc.sandbox import (
    RuncOptions,
    RuncSandbox,
    remove_orphans,
)
from deskbox_server.errors import Conflict, InvalidRequest, SessionFailed
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Size

from .conftest import agent_desktop


def _cgroup_dirs(container_id: str) -> list[Path]:
    return [p for p in Path("/sys/fs/cgroup").glob(f"*/{container_id}") if p.exists()] + [
        p for p in Path("/sys/fs/cgroup").glob(f"*/*/{container_id}") if p.exists()
    ]


def _mounts_mentioning(text: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if text in line]


def test_destroy_leaves_nothing(options: RuncOptions) -> None:
    box = RuncSandbox.start(options, f"t-destroy-{os.getpid()}", browser=False)
    assert box.display is not None and box.init_pid is not None
    number, init_pid = box.display.number, box.init_pid
    assert options.runc.state(box.container_id) is not None
    assert _cgroup_dirs(box.container_id)
    box.destroy()
    box.destroy()  # idempotent
    assert options.runc.state(box.container_id) is None
    assert box.container_id not in options.runc.list_ids()
    assert not Path(f"/proc/{init_pid}").exists()
    assert not _cgroup_dirs(box.container_id)
    assert not _mounts_mentioning(str(box.session_dir))
    assert not _mounts_mentioning(str(box.shared_dir)) and not box.shared_dir.exists()
    assert not os.path.lexists(f"/tmp/.X11-unix/X{number}")
    assert not os.path.exists(f"/tmp/.X{number}-lock")
    assert not box.session_dir.exists()


def test_a_killed_sandbox_reports_failure(options: RuncOptions) -> None:
    box = RuncSandbox.start(options, f"t-killed-{os.getpid()}", browser=False)
    try:
        assert box.failure() is None
        assert box.init_pid is not None
        os.kill(box.init_pid, signal.SIGKILL)
        os.waitid(os.P_PIDFD, box._pidfd, os.WEXITED | os.WNOWAIT)  # type: ignore[arg-type]
        assert box.failure() is not None
    finally:
        box.destroy()


def test_bad_session_id_is_refused(options: RuncOptions) -> None:
    with pytest.raises(InvalidRequest):
        RuncSandbox.start(options, "../escape")


def test_failure_to_start_cleans_up(options: RuncOptions) -> None:
    broken = RuncOptions(
        state_dir=options.state_dir, rootfs=options.state_dir / "no-such-rootfs",
        runc=options.runc,
    )
    with pytest.raises(SessionFailed, match="rootfs"):
        RuncSandbox.start(broken, f"t-broken-{os.getpid()}", timeout_s=10)
    assert not (options.state_dir / "sessions" / f"t-broken-{os.getpid()}").exists()
    assert f"deskbox-t-broken-{os.getpid()}" not in options.runc.list_ids()


async def test_adopt_a_running_sandbox(options: RuncOptions) -> None:
    """A restarted server takes over a sandbox it did not start, its agent and all."""
    first = RuncSandbox.start(options, f"t-adopt-{os.getpid()}", browser=False)
    try:
        assert first.display is not None
        first.display.host_link.unlink()  # as if /tmp had been cleaned meanwhile
        adopted = RuncSandbox.adopt(options, first.session_id)
        assert adopted.display_name == first.display_name and adopted.failure() is None
        async with agent_desktop(adopted) as desktop:
            assert await desktop.perform(a.ScreenSize()) == Size(width=1280, height=800)
        adopted.destroy()
        assert first.failure() is not None
    finally:
        first.destroy()


def test_remove_orphans(options: RuncOptions, tmp_path: Path) -> None:
    # Its own prefix and state directory, as every server has: a sweep takes everything
    # under them (here: the other tests' sandboxes, the VM tests' networks booting meanwhile).
    own = dataclasses.replace(options, state_dir=tmp_path,
                              id_prefix=f"deskbox-orphans{os.getpid()}-")
    orphan = RuncSandbox.start(own, f"t-orphan-{os.getpid()}", browser=False)
    assert orphan.display is not None
    number = orphan.display.number
    orphan._reap_init = lambda: None  # type: ignore[method-assign]  # forgotten, not reaped
    removed = remove_orphans(own)
    assert removed == [orphan.session_id]
    assert orphan.container_id not in options.runc.list_ids()
    assert not orphan.session_dir.exists()
    assert not os.path.lexists(f"/tmp/.X11-unix/X{number}")
    assert not os.path.exists(f"/tmp/.X{number}-lock")
    assert orphan._pidfd is not None
    os.close(orphan._pidfd)


def test_a_taken_id_is_a_conflict_and_harms_nothing(options: RuncOptions) -> None:
    box = RuncSandbox.start(options, f"t-twice-{os.getpid()}", browser=False)
    try:
        with pytest.raises(Conflict):
            RuncSandbox.start(options, box.session_id, browser=False)
        assert box.failure() is None and box.session_dir.exists()
    finally:
        box.destroy()
