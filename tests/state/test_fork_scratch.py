"""Where forks checkpoint (sessions/fork_scratch.py): in the scratch directory while it has
room for the session's memory limit, else under the state dir; a killed server's scratch
is removed by the next start on the same state dir, no other."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from deskbox_server.sessions.fork_scratch import ForkDirectories, scratch_prefix

MIB = 1 << 20


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A state dir, its on-disk fork directory and a scratch directory."""
    state, scratch = tmp_path / "state", tmp_path / "scratch"
    (state / "snapshots").mkdir(parents=True)  # the snapshot store's, made at its open
    scratch.mkdir()
    return state, state / "snapshots" / ".forks", scratch


def test_a_fork_checkpoints_in_the_scratch_while_it_has_room(
    dirs: tuple[Path, Path, Path],
) -> None:
    state, on_disk, scratch = dirs
    forks = ForkDirectories(on_disk, scratch, state)
    forks.open()
    (private,) = scratch.iterdir()
    assert private.name.startswith(scratch_prefix(state))
    assert private.stat().st_mode & 0o777 == 0o700

    first, second = forks.new(64 * MIB), forks.new(64 * MIB)
    assert first.parent == second.parent == private and first != second
    assert not first.exists()  # the engine makes it

    free = shutil.disk_usage(scratch).free
    assert forks.new(free + 1).parent == on_disk  # no room: the disk
    assert on_disk.is_dir()

    forks.close()
    assert list(scratch.iterdir()) == []


def test_without_a_scratch_directory_forks_go_to_the_disk(
    dirs: tuple[Path, Path, Path],
) -> None:
    state, on_disk, scratch = dirs
    for missing in (None, scratch / "not-there"):
        forks = ForkDirectories(on_disk, missing, state)
        forks.open()  # a scratch that is not there is no error
        assert forks.new(MIB).parent == on_disk
        forks.close()


def test_a_start_removes_its_state_dirs_old_scratch_and_nothing_else(
    dirs: tuple[Path, Path, Path], tmp_path: Path,
) -> None:
    state, on_disk, scratch = dirs
    left = scratch / (scratch_prefix(state) + "killed")
    (left / "images").mkdir(parents=True)
    (left / "images" / "pages-1.img").write_bytes(b"\0" * 4096)
    other_state = tmp_path / "other"
    other_state.mkdir()
    another_servers = scratch / (scratch_prefix(other_state) + "running")
    another_servers.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("not ours to remove")
    link = scratch / (scratch_prefix(state) + "link")
    link.symlink_to(target)

    forks = ForkDirectories(on_disk, scratch, state)
    forks.open()
    assert not left.exists()
    assert another_servers.is_dir()
    assert link.is_symlink() and (target / "keep").exists()
    if os.geteuid() == 0:  # a directory another user made under our name stays too
        foreign = scratch / (scratch_prefix(state) + "foreign")
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        ForkDirectories(on_disk, scratch, state).open()
        assert foreign.is_dir()
    forks.close()
