"""A runc session's display number ``:N`` on the host (engines/runc/displays.py): a server
that restarts takes back only what is still its own. While no server ran, a host X server
may have claimed the number (the lock named a dead process, which X servers take for
stale); the restarted server's cleanup deleted that server's lock, and its adoption pointed
the display's socket path at the sandbox, taking the display over."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.runc.displays import DisplayReservation
from deskbox_server.errors import DesktopFailed


@pytest.fixture
def reservation(tmp_path: Path) -> Iterator[DisplayReservation]:
    held = DisplayReservation.allocate(tmp_path / "display", 900, 1000)
    try:
        yield held
    finally:
        held.host_link.unlink(missing_ok=True)
        held.lock_path.unlink(missing_ok=True)


@pytest.fixture
def other_process() -> Iterator[int]:
    """A live process of the host that is not this server (an X server, say)."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def _lock_names(reservation: DisplayReservation, pid: int) -> None:
    os.chmod(reservation.lock_path, 0o644)
    reservation.lock_path.write_text(f"{pid:>10}\n")


def test_a_number_another_x_server_claimed_is_neither_taken_over_nor_released(
    reservation: DisplayReservation, other_process: int,
) -> None:
    _lock_names(reservation, other_process)
    with pytest.raises(DesktopFailed, match="taken by another X server"):
        reservation.take_over()
    reservation.release(any_owner=True)  # an orphan's cleanup at the next start
    assert reservation.lock_path.read_text().strip() == str(other_process)


def test_a_socket_path_another_x_server_made_is_not_replaced(
    reservation: DisplayReservation, tmp_path: Path,
) -> None:
    reservation.host_link.symlink_to(tmp_path / "someone-elses-socket")
    with pytest.raises(DesktopFailed, match="taken by another X server"):
        reservation.take_over()
    assert os.readlink(reservation.host_link) == str(tmp_path / "someone-elses-socket")


def test_a_dead_servers_number_is_taken_back(reservation: DisplayReservation) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    _lock_names(reservation, gone.pid)  # the previous server, killed
    reservation.take_over()
    assert reservation.lock_path.read_text().strip() == str(os.getpid())
    reservation.release(any_owner=True)
    assert not reservation.lock_path.exists()
