"""How long the desktop's programs waited for a CPU: settling does not count quiet in
which they could not have drawn.

A screen that shows nothing new for 100 ms is settled only if its programs were free to
draw meanwhile. With the session's CPU taken (a build the agent runs beside the browser,
a host with more desktops than cores), Chromium may not even have read a click when the
100 ms are over: with six busy loops in a sandbox of one CPU, 8 to 13 of 60 settled
screenshots after a click showed the page before it (2026-12-07, bench/settle_busy.py).
The kernel counts, per thread, the time it was runnable but not running (the second field
of ``/proc/<pid>/task/<tid>/schedstat``). A click's answer passes through a chain of
threads (the browser's X reader, the renderer's main thread and compositor, the display
compositor, the X server): for each program the longest wait of one of its threads,
summed over the programs, is the time the chain was held. Summing every thread instead
counts the many threads that wait side by side many times over (settles twice as long
with two busy loops, for no screenshot less wrong); the main threads alone missed the
compositors' waits (the test still failed).

The programs: the X server (the peer of our connection), its clients (their pids from the
X-Resource extension) and the descendants of each client that bear its name (Chromium's
zygote, renderers and utility processes), but not the agent nor what it runs: a build's
processes wait for a CPU all the time and draw nothing. Found again every few seconds,
before actions whose settling is awaited (a navigation starts renderers), on the desktop's
worker: never on the event loop's quick pointer path, which must not wait on the X server
(a stalled X server would hold every call). The files are opened at each sample, never
kept open: CRIU cannot restore a process that holds another task's ``/proc`` files
(criu#1553), and the sandbox may be checkpointed at any time.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from Xlib.display import Display
from Xlib.ext import res

from .procstat import proc_stat

__all__ = ["CpuWaits", "Sample"]

# pid -> (tid -> nanoseconds the thread has waited for a CPU since it started).
Sample = dict[int, dict[int, int]]
_REFRESH_S = 5.0
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_MAX_DEPTH = 64  # of a process tree


class CpuWaits:
    """The desktop's programs' waits for a CPU; use from the desktop's thread only."""

    def __init__(self, display: Display) -> None:
        self._display = display
        self._server = _server_pid(display)  # the peer of a connection never changes
        self._pids: tuple[int, ...] = ()
        self._found_at = -_REFRESH_S

    def refresh(self) -> None:
        """Find the programs again if the last look is a few seconds old (an X round trip
        and a few ms of reading ``/proc``): called before actions, so that the samples
        taken while the screen settles after them do not pay for it, nor miss the waits
        it takes."""
        if time.monotonic() - self._found_at >= _REFRESH_S:
            self._pids = self._find()
            self._found_at = time.monotonic()

    def sample(self) -> Sample:
        """Each program's threads' waits so far (~1 ms for Chromium's ~60 threads; a
        program that exited meanwhile is left out)."""
        self.refresh()
        waits: Sample = {}
        for pid in self._pids:
            try:
                threads = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue  # exited
            waited = waits[pid] = {}
            for tid in threads:
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as stat:
                        waited[int(tid)] = int(stat.read(128).split()[1])
                except (OSError, ValueError, IndexError):
                    continue
        return waits

    @staticmethod
    def held_s(before: Sample, after: Sample) -> float:
        """How long the programs were held between the two samples, in seconds: for each
        program the longest wait of one of its threads, summed over the programs."""
        held = 0
        for pid, threads in before.items():
            later = after.get(pid, {})
            held += max((later[tid] - waited for tid, waited in threads.items() if tid in later),
                        default=0)
        return held / 1e9

    def _find(self) -> tuple[int, ...]:
        """The X server, its clients other than this process, and their same-program
        descendants; none that cannot be known (no X-Resource, a remote X server)."""
        me = os.getpid()
        clients = {pid for pid in self._client_pids() if pid != me}
        server = self._server
        if not clients and server is None:
            return ()
        processes: dict[int, tuple[bytes, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (stat := _name_and_parent(int(name))) is not None:
                processes[int(name)] = stat
        found = set(clients)
        for pid, (program, parent) in processes.items():
            ancestor: int | None = parent
            # Bounded: parents read at different times could, with pids reused, loop.
            for _ in range(_MAX_DEPTH):
                if ancestor is None or ancestor in clients or ancestor == me:
                    break
                ancestor = processes[ancestor][1] if ancestor in processes else None
            if ancestor in clients and processes.get(ancestor, (None, 0))[0] == program:
                found.add(pid)
        if server is not None:
            found.add(server)
        return tuple(sorted(found))

    def _client_pids(self) -> list[int]:
        if not self._display.has_extension(res.extname):
            return []
        try:
            reply = self._display.res_query_client_ids(
                [{"client": 0, "mask": res.LocalClientPIDMask}])
        except Exception:  # noqa: BLE001 (a server that refuses: count no waits)
            return []
        return [int(value.value[0]) for value in reply.ids if value.value]


def _server_pid(display: Display) -> int | None:
    """The X server's pid: the peer of the connection's unix socket (None over TCP)."""
    try:
        sock = socket.socket(fileno=os.dup(display.fileno()))
    except OSError:
        return None
    try:
        if sock.family != socket.AF_UNIX:
            return None
        pid, _, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return pid if pid > 0 else None
    except OSError:
        return None
    finally:
        sock.close()


def _name_and_parent(pid: int) -> tuple[bytes, int] | None:
    """The process's name and its parent's pid."""
    stat = proc_stat(pid)
    if stat is None or len(stat[1]) < 2 or not stat[1][1].isdigit():
        return None
    return stat[0], int(stat[1][1])
