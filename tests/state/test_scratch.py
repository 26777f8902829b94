"""The server's scratch directories (scratch.py) and where forks checkpoint
(sessions/fork_scratch.py): in the scratch directory while it has room for the session's
memory limit, else under the state dir; a killed server's scratch is removed by the next
start on the same state dir, and nothing else is."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from deskbox_server.scratch import Scratch, scratch_prefix
from deskbox_server.sessions.fork_scratch import ForkDirectories

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
    forks.open(forks=True)
    (private,) = scratch.iterdir()
    assert private.name.startswith(scratch_prefix(state, "fork"))
    assert private.stat().st_mode & 0o777 == 0o700

    first, second = forks.new(64 * MIB), forks.new(64 * MIB)
    assert first.parent == second.parent == private and first != second
    assert not first.exists()  # the engine makes it

    # More than the whole file system: its free space moves while the suite runs (a full
    # run saw it grow past the free space read a moment before).
    beyond = shutil.disk_usage(scratch).total + 1
    assert forks.new(beyond).parent == on_disk  # no room: the disk
    assert on_disk.is_dir()

    forks.close()
    assert list(scratch.iterdir()) == []


def test_without_a_scratch_directory_forks_go_to_the_disk(
    dirs: tuple[Path, Path, Path],
) -> None:
    state, on_disk, scratch = dirs
    for missing in (None, scratch / "not-there"):
        forks = ForkDirectories(on_disk, missing, state)
        forks.open(forks=True)  # a scratch that is not there is no error
        assert forks.new(MIB).parent == on_disk
        forks.close()


def test_each_purpose_has_its_own_directory(dirs: tuple[Path, Path, Path]) -> None:
    state, _, scratch = dirs
    forks, images = Scratch(scratch, state, "fork"), Scratch(scratch, state, "images")
    forks.open()
    images.open()
    assert forks.room(MIB) != images.room(MIB)
    assert images.room(shutil.disk_usage(scratch).total + 1) is None  # more than all of it
    images.close()
    assert forks.room(MIB) is not None and images.room(MIB) is None
    forks.close()


def test_a_start_removes_its_state_dirs_old_scratch_and_nothing_else(
    dirs: tuple[Path, Path, Path], tmp_path: Path,
) -> None:
    state, _, scratch = dirs
    prefix = scratch_prefix(state, "images")
    left = scratch / (prefix + "killed")
    (left / "images").mkdir(parents=True)
    (left / "images" / "pages-1.img").write_bytes(b"\0" * 4096)
    other_state = tmp_path / "other"
    other_state.mkdir()
    another_servers = scratch / (scratch_prefix(other_state, "images") + "running")
    another_servers.mkdir()
    own_forks = scratch / (scratch_prefix(state, "fork") + "running")
    own_forks.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("not ours to remove")
    link = scratch / (prefix + "link")
    link.symlink_to(target)

    images = Scratch(scratch, state, "images")
    images.open()
    assert not left.exists()
    assert another_servers.is_dir() and own_forks.is_dir()
    assert link.is_symlink() and (target / "keep").exists()
    if os.geteuid() == 0:  # a directory another user made under our name stays too
        foreign = scratch / (prefix + "foreign")
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
        Scratch(scratch, state, "images").open()
        assert foreign.is_dir()
    images.close()


def test_a_server_that_cannot_fork_makes_no_fork_scratch_but_clears_a_killed_ones(
    dirs: tuple[Path, Path, Path],
) -> None:
    state, on_disk, scratch = dirs
    left = scratch / (scratch_prefix(state, "fork") + "killed")
    left.mkdir()
    forks = ForkDirectories(on_disk, scratch, state)
    forks.open(forks=False)
    assert list(scratch.iterdir()) == []
    forks.close()
