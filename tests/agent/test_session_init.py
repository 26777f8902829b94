"""What the agent reads of the session's init (its logs, the browser's pid and state) and
the stuck browser it restarts; the whole path, from the init to the session's error, is
tested in tests/isolation/test_agent_init.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from deskbox_agent.desktop import session_init


def test_the_last_whole_lines_of_each_log_are_quoted(tmp_path: Path) -> None:
    # A log far bigger than what is read of it: only whole lines from its end.
    (tmp_path / "session.log").write_text("".join(f"line {n}\n" for n in range(5000)))
    (tmp_path / "browser.log").write_text('a "quoted"\x1b[31m word\n\n\nrestarting\n')
    (tmp_path / "wm.log").write_text("")
    assert session_init.clues(str(tmp_path), "wm", "browser", "missing") == (
        '; the session\'s init: "line 4997", "line 4998", "line 4999"'
        "; the browser's output: \"a 'quoted'?[31m word\", \"restarting\"")


def test_a_long_line_is_cut(tmp_path: Path) -> None:
    (tmp_path / "session.log").write_text("x" * 10_000)
    quoted = session_init.clues(str(tmp_path))
    assert quoted.startswith('; the session\'s init: "xxx') and quoted.endswith('x…"')
    assert len(quoted) < 250


def _browser_status(tmp_path: Path, pid: int) -> None:
    (tmp_path / "status.json").write_text(json.dumps({"state": "running", "pids": {
        "xserver": 2, "browser": pid}}))


def _check_for(stuck: session_init.StuckBrowser, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        stuck.check()
        time.sleep(0.05)


def _process(name: str, code: str) -> subprocess.Popen[bytes]:
    """A Python process that calls itself ``name`` (its /proc comm), then runs ``code``."""
    rename = f"import ctypes; ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
    return subprocess.Popen([sys.executable, "-c", rename + code])


def test_a_browser_that_does_nothing_is_killed_and_a_busy_one_is_not(tmp_path: Path) -> None:
    """StuckBrowser reads the init's status.json for the browser's pid and its CPU time
    from /proc: stuck (asleep, stopped or deadlocked) is killed, slow (busy) is left, and a
    process that is no browser (a pid the kernel gave to another) is never killed."""
    busy = _process("chromium", "while True: pass")
    idle = _process("chromium", "import time; time.sleep(60)")
    other = _process("python3", "import time; time.sleep(60)")
    try:
        _browser_status(tmp_path, busy.pid)
        stuck = session_init.StuckBrowser(str(tmp_path), after_s=0.6)
        _check_for(stuck, 1.5)
        assert busy.poll() is None and stuck.restarted == []
        quoted = session_init.clues(str(tmp_path), "browser")
        assert f"the browser (pid {busy.pid}): state R" in quoted, quoted

        _browser_status(tmp_path, other.pid)
        _check_for(stuck, 1.5)
        assert other.poll() is None and stuck.restarted == []

        _browser_status(tmp_path, idle.pid)  # the init started another one
        _check_for(stuck, 0.3)
        assert idle.poll() is None  # not yet: seen for less than after_s
        _check_for(stuck, 1.0)
        assert idle.wait(timeout=5) == -signal.SIGKILL and stuck.restarted == [idle.pid]
    finally:
        for process in (busy, idle, other):
            process.kill()
            process.wait()
