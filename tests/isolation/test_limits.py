"""cgroup limits from the session's resources hold, and the host stays unaffected."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.runc.layout import Limits
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox

from .conftest import exec_in

LIMITS = Limits(cpus=0.5, memory_mb=256, pids=64)


@pytest.fixture(scope="module")
def small(options: RuncOptions) -> Iterator[RuncSandbox]:
    box = RuncSandbox.start(options, f"t-small-{os.getpid()}", limits=LIMITS, browser=False,
                              boost=False)
    try:
        yield box
    finally:
        box.destroy()


def _cgroup(controller: str, box: RuncSandbox, name: str) -> str:
    return (Path("/sys/fs/cgroup") / controller / box.container_id / name).read_text().strip()


def test_limits_are_applied(small: RuncSandbox) -> None:
    assert int(_cgroup("memory", small, "memory.limit_in_bytes")) == 256 * 1024 * 1024
    # Memory and swap together at the same bound: no swap past the limit (this host
    # counts swap; runc left it unbounded before).
    assert int(_cgroup("memory", small, "memory.memsw.limit_in_bytes")) == 256 * 1024 * 1024
    assert _cgroup("pids", small, "pids.max") == "64"
    assert _cgroup("cpu", small, "cpu.cfs_quota_us") == "50000"
    assert _cgroup("cpu", small, "cpu.cfs_period_us") == "100000"


def test_fork_bomb_hits_the_pids_limit(small: RuncSandbox) -> None:
    bomb = (
        "import os, signal, time\n"
        "kids, refused = [], 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except BlockingIOError:\n"
        "        refused += 1\n"
        "        continue\n"
        "    if pid == 0:\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "for pid in kids:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n"
        "print(len(kids), refused)\n"
    )
    done = exec_in(small, "python3", "-c", bomb)
    forked, refused = map(int, done.stdout.split())
    assert forked < LIMITS.pids and refused > 0, done.stderr
    assert int(_cgroup("pids", small, "pids.events").split()[-1]) > 0  # "max N": refusals
    assert small.failure() is None
    # the desktop still answers
    assert exec_in(small, "true").returncode == 0


def test_memory_hog_is_killed(small: RuncSandbox) -> None:
    hog = "b = bytearray(512 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"
    done = exec_in(small, "python3", "-c", hog)
    assert done.returncode != 0 and "survived" not in done.stdout
    assert small.failure() is None  # the OOM killer took the hog, not the session
