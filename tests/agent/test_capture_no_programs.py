"""The agent's screen capture is set up without running a program.

mss named its X libraries with ``ctypes.util.find_library``, which runs ``ldconfig -p``
(or gcc, or ld) for each: eight children at every agent's first desktop call, and when
none could start (a sandbox at its pids limit: the fork fails with EAGAIN, which
find_library takes for "not found") the desktop failed with "Library libxcb.so not found".
Here the capture is set up by a process in a pids cgroup that lets it start nothing more,
as a sandbox at its limit is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..local_desktop import HostDesktop
from .conftest import AGENT_DIR

CGROUP_ROOT = Path("/sys/fs/cgroup")


def pids_root() -> Path:
    """Where a pids-limited group is made: the v1 pids controller's hierarchy, else the
    unified (v2) one if its root hands the pids controller down. The suite runs as root on
    hosts with either (the sandboxes' pids limits need one)."""
    if (CGROUP_ROOT / "pids").is_dir():
        return CGROUP_ROOT / "pids"
    controllers = CGROUP_ROOT / "cgroup.subtree_control"
    assert controllers.is_file() and "pids" in controllers.read_text().split(), (
        "no cgroup pids controller to test the capture at a pids limit in")
    return CGROUP_ROOT

# Everything that starts threads (numpy's) and the X connection come first; then the
# process joins the group, whose limit lets it start no task at all (below what it holds
# while its threads run: none may end and leave room for a child).
CAPTURE_AT_THE_LIMIT = """
import os, sys
from pathlib import Path
import numpy
from Xlib.display import Display

display_name, group = sys.argv[1], Path(sys.argv[2])
xlib_display = Display(display_name)
(group / "cgroup.procs").write_text(str(os.getpid()))
(group / "pids.max").write_text("1")
children = []
sys.addaudithook(lambda event, args: children.append(event)
                 if event in ("subprocess.Popen", "os.posix_spawn", "os.fork") else None)
from deskbox_agent.desktop.capture import Capturer
frame = Capturer(display_name, xlib_display).grab(0, 0, 64, 32)
print(frame.width, frame.height, children)
"""


@pytest.fixture(scope="module")
def bare_display() -> Iterator[HostDesktop]:
    with HostDesktop(browser=False) as desktop:
        yield desktop


@pytest.fixture
def pids_group() -> Iterator[Path]:
    group = pids_root() / f"deskbox-test-capture-{os.getpid()}"
    group.mkdir()
    try:
        yield group
    finally:
        group.rmdir()  # the child has ended: the group is empty


def test_capture_starts_at_the_pids_limit_and_runs_no_program(
    bare_display: HostDesktop, agent_site: Path, pids_group: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{AGENT_DIR}{os.pathsep}{agent_site}"}
    done = subprocess.run(
        [sys.executable, "-c", CAPTURE_AT_THE_LIMIT, bare_display.display_name,
         str(pids_group)], env=env, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["64", "32", "[]"], done.stdout
