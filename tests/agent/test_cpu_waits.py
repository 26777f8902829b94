"""Which programs' waits for a CPU settling counts (deskbox_agent.desktop.cpu_waits), and
that a program kept from a CPU shows as held: a real Xvfb and Chromium, real busy loops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from Xlib.display import Display

from deskbox_agent.desktop.cpu_waits import CpuWaits, _name_and_parent

from ..local_desktop import HostDesktop

BUSY = "while True: pass"
# An X client that works in bursts: runnable often, so kept waiting beside busy loops.
BURSTY_CLIENT = (
    "import sys, time\n"
    "from Xlib.display import Display\n"
    "d = Display(sys.argv[1])\n"
    "print('connected', flush=True)\n"
    "while True:\n"
    "    end = time.monotonic() + 0.002\n"
    "    while time.monotonic() < end: pass\n"
    "    time.sleep(0.001)\n"
)


@pytest.fixture(scope="module")
def desktop() -> Iterator[HostDesktop]:
    with HostDesktop() as running:
        yield running


@pytest.fixture
def display(desktop: HostDesktop) -> Iterator[Display]:
    connection = Display(desktop.display_name)
    yield connection
    connection.close()


def names(pids: object) -> list[bytes]:
    assert isinstance(pids, dict)
    found = [_name_and_parent(pid) for pid in pids]
    return sorted(stat[0] for stat in found if stat is not None)


def started(*argv: str, output: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE if output else subprocess.DEVNULL,
                            text=True)


def stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_the_x_server_and_the_browsers_processes_are_watched_not_the_callers_children(
        display: Display) -> None:
    busy = started(sys.executable, "-c", BUSY)  # what the agent runs: never an X client
    try:
        sample = CpuWaits(display).sample()
    finally:
        stop([busy])
    watched = names(sample)
    assert watched.count(b"Xvfb") == 1
    # The browser, its zygote, GPU process and renderer at least.
    assert watched.count(b"chromium") >= 4, watched
    assert busy.pid not in sample and os.getpid() not in sample
    browser = max(sample.values(), key=len)  # its threads: the X reader, the compositor, ...
    assert len(browser) > 5 and all(waited >= 0 for waited in browser.values())


def test_a_program_kept_from_its_cpu_shows_as_held(desktop: HostDesktop,
                                                     display: Display) -> None:
    client = started(sys.executable, "-c", BURSTY_CLIENT, desktop.display_name, output=True)
    loops: list[subprocess.Popen[str]] = []
    try:
        assert client.stdout is not None and client.stdout.readline() == "connected\n"
        waits = CpuWaits(display)
        os.sched_setaffinity(client.pid, {0})
        calm = waits.sample()
        assert client.pid in calm
        time.sleep(0.3)
        alone = CpuWaits.held_s(calm, waits.sample())
        loops = [started(sys.executable, "-c", BUSY) for _ in range(3)]
        for loop in loops:
            os.sched_setaffinity(loop.pid, {0})
        time.sleep(0.2)
        before = waits.sample()
        time.sleep(0.3)
        crowded = CpuWaits.held_s(before, waits.sample())
    finally:
        stop([client, *loops])
    # Three loops on its CPU: the client waits for most of each of its bursts.
    assert crowded > 0.05, (alone, crowded)
    assert crowded > 3 * alone, (alone, crowded)


def test_held_sums_each_programs_longest_wait_between_two_samples() -> None:
    """Threads of one program wait side by side; programs on a click's way, one after
    another (cpu_waits.py)."""
    before = {10: {10: 1_000_000, 11: 5_000_000, 12: 0}, 20: {20: 0}, 30: {30: 0}}
    # 12 and program 30 ended meanwhile; 21 started.
    after = {10: {10: 31_000_000, 11: 25_000_000}, 20: {20: 10_000_000, 21: 99_000_000}}
    assert CpuWaits.held_s(before, after) == pytest.approx(0.030 + 0.010)
    assert CpuWaits.held_s({}, after) == 0.0
