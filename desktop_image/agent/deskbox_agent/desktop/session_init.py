"""What the agent knows of the session's init, for a desktop that does not come up in time.

``deskbox-session`` (the image's PID 1) tells the agent in the environment variable
:data:`ENV` (which the agent takes out of its environment, so that commands it runs do not
see it) the directory of its files: its own log (which process exited, with what, and when
it was started again), each process's output (``browser.log``: Chromium's stderr) and
``status.json`` (the processes' pids). A ``ready`` that timed out quotes the logs' last
lines and the browser's state, so that "no browser window in 30 s" comes with why: a
browser that keeps crashing, one that is stuck, what it printed last. While ``ready``
waits, :class:`StuckBrowser` restarts a browser that shows no window and does nothing.
Without the variable (a host's own desktop) there is nothing to quote or restart.
"""

from __future__ import annotations

import json
import os
import signal
import time

from .procstat import proc_stat

__all__ = ["ENV", "StuckBrowser", "clues"]

ENV = "DESKBOX_INIT_LOGS"
_TAIL_BYTES = 4096  # read from each log's end: its last lines, however big it grew
_LINES = 3
_LINE_CHARS = 160
_CHARS = 900  # of them all: the host keeps 1,024 characters of an error's message
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def clues(directory: str, *processes: str) -> str:
    """``; <name>'s log: "…", "…"`` for the init's own log and each of ``processes``'
    output that has any, and the browser's state."""
    quoted = []
    for name, label in [("session", "the session's init"),
                        *((process, f"the {process}'s output") for process in processes)]:
        lines = _last_lines(os.path.join(directory, f"{name}.log"))
        if lines:
            quoted.append(f"{label}: " + ", ".join(f'"{line}"' for line in lines))
    if "browser" in processes and (browser := _browser(directory)) is not None:
        pid, state, cpu_s = browser
        quoted.append(f"the browser (pid {pid}): state {state}, {cpu_s:.2f} s of CPU")
    return _cut("".join(f"; {part}" for part in quoted), _CHARS)


def _browser(directory: str) -> tuple[int, str, float] | None:
    """The browser's pid (as the init last wrote it), state letter and CPU seconds; None
    without one (no browser, one that just exited, a pid that is no browser any more)."""
    try:
        with open(os.path.join(directory, "status.json"), "rb") as status:
            pid = json.loads(status.read(65536)).get("pids", {}).get("browser")
    except (OSError, ValueError, AttributeError):
        return None
    if type(pid) is not int or pid <= 1 or (stat := _stat(pid)) is None:
        return None
    return pid, *stat


class StuckBrowser:
    """Restarts a browser that has shown no window for ``after_s`` since we first saw it
    and used less than ``idle_cpu_s`` of CPU over the last ``after_s / 2``, never seen
    waiting for a disk meanwhile: stuck, not slow (a browser starting on a busy host keeps
    using CPU). Killing it is enough: the init starts it again (deskbox-session).

    Seen a few times in this project's test runs, with four sessions starting at once on
    two cores (fewer than 1 start in 300): a browser that showed no window in 30 s, where
    it takes 0.2-3 s. The cause inside Chromium is unknown; a browser stuck busy is left
    alone, and a ``ready`` that times out says so (:func:`clues`). ``check`` is called
    while ``ready`` waits for the window.
    """

    def __init__(self, directory: str, after_s: float = 10.0, idle_cpu_s: float = 0.1) -> None:
        self.directory = directory
        self.after_s = after_s
        self.idle_cpu_s = idle_cpu_s
        self.restarted: list[int] = []
        self._pid: int | None = None
        self._first_seen = 0.0
        self._samples: list[tuple[float, float]] = []  # (when, CPU seconds) of self._pid
        self._next_check = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 0.25
        browser = _browser(self.directory)
        if browser is None:
            return  # the init starts one again
        pid, state, cpu_s = browser
        if pid != self._pid:
            self._pid, self._first_seen, self._samples = pid, now, []
        if state == "D":
            self._samples = []  # waiting for a disk (a VM's, reading Chromium): not stuck
        self._samples.append((now, cpu_s))
        window = self.after_s / 2
        while len(self._samples) > 1 and self._samples[1][0] <= now - window:
            self._samples.pop(0)
        oldest_at, oldest_cpu = self._samples[0]
        if (now - self._first_seen >= self.after_s and now - oldest_at >= window
                and cpu_s - oldest_cpu < self.idle_cpu_s):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                return
            self.restarted.append(pid)
            self._pid = None


# The browser's process: `nice` for the moment before it execs Chromium (deskbox-session).
_BROWSER_NAMES = (b"chromium", b"nice")


def _stat(pid: int) -> tuple[str, float] | None:
    """The browser's state letter and CPU seconds (all its threads), or None if ``pid`` is
    gone or is no browser (any more)."""
    stat = proc_stat(pid)
    if stat is None:
        return None
    name, fields = stat
    if name not in _BROWSER_NAMES or len(fields) < 13 or fields[0] == b"Z":
        return None
    return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def _last_lines(path: str) -> list[str]:
    try:
        with open(path, "rb") as log:
            start = max(0, os.fstat(log.fileno()).st_size - _TAIL_BYTES)
            log.seek(start)
            lines = log.read(_TAIL_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    if start and len(lines) > 1:
        lines = lines[1:]  # cut at its start
    return [line for line in map(_printable, lines) if line][-_LINES:]


def _printable(line: str) -> str:
    return _cut("".join(c if c.isprintable() else "?" for c in line.strip()).replace('"', "'"),
                _LINE_CHARS)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
