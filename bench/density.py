"""Density: how many idle sessions fit here, and what they do to session 1's latency.

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/density.py [--steps 1,5,10,20,40] [--iterations 50] [--idle-s 10]

It starts ``deskbox serve`` (bench/api.py's helper; container backend, session limits raised)
and adds idle sessions (1280x800, a static start page) until each step's count runs. At each
step, after ``--idle-s`` of quiet, it measures:

- memory: PSS (``/proc/PID/smaps_rollup``) summed over every sandbox's processes (its
  cgroup's: init, Xvfb, openbox, Chromium's and the desktop's agent, ``deskbox-agent``), per
  session and added per session since the previous step, and the agent's share of it; the
  server process's PSS; the drop of the host's MemAvailable per session;
- idle CPU: each sandbox cgroup's ``cpuacct.usage`` over ``--cpu-window-s``, in % of one core
  per session, and the whole host's busy CPU (``/proc/stat``) over the same window;
- session 1's websocket round trips (JPEG q75 screenshot, click): p50 and p95.

Then it projects sessions per 24 GiB from memory, and the count at which idle CPU alone
would fill the host's cores. Guard: no session is added while MemAvailable is below
``--min-available-gib`` (3). Every session is deleted and the server stopped on exit,
Ctrl-C and SIGTERM included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import api as bench_api  # bench/api.py (this script's directory): the server helper
import httpx
from websockets.sync.client import ClientConnection, connect

GIB = 2**30
PROJECT_GIB = 24
SHOT = {"type": "screenshot", "format": "jpeg", "quality": 75}
CLICK = {"type": "click", "x": 640, "y": 500}
# A session's action latency counts as blown up past this multiple of step 1's p50.
BLOW_UP = 2.0


def progress(message: str) -> None:
    print(f"[density] {message}", file=sys.stderr, flush=True)


# -- host and cgroup readings ---------------------------------------------------------------


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("no MemAvailable in /proc/meminfo")


def pss_kib(pid: int) -> int:
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0  # exited meanwhile
    for line in rollup.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def agent_pss_kib(session_id: str) -> int:
    """PSS of the session's agent (``deskbox-agent``, started by the sandbox's init): part
    of the session's PSS above, shown apart because it is this project's own process."""
    total = 0
    for pid in bench_api.container_pids(session_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(Path(arg.decode(errors="replace")).name == "deskbox-agent" for arg in argv[:3]):
            total += pss_kib(pid)
    return total


def cpu_usage_ns(session_id: str) -> int:
    """CPU time of a sandbox's cgroup (v1 cpuacct; the server names it deskbox-*-<id>)."""
    for usage in Path("/sys/fs/cgroup/cpuacct").glob(f"deskbox-*-{session_id}/cpuacct.usage"):
        return int(usage.read_text())
    raise SystemExit(f"no cpuacct cgroup for {session_id}")


def cgroup_memory(session_id: str) -> int | None:
    """Bytes charged to a sandbox's memory cgroup (v1 usage_in_bytes, v2 memory.current):
    what its memory limit sees, page cache it touched first included."""
    for name in ("memory/deskbox-*-{}/memory.usage_in_bytes",
                 "unified/deskbox-*-{}/memory.current"):
        for usage in Path("/sys/fs/cgroup").glob(name.format(session_id)):
            return int(usage.read_text())
    return None


def host_busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def idle_cpu(session_ids: Sequence[str], window_s: float) -> tuple[float, float]:
    """(mean % of one core per session, host busy % of all cores) over ``window_s``."""
    before = [cpu_usage_ns(s) for s in session_ids]
    host_before = host_busy_jiffies()
    time.sleep(window_s)
    after = [cpu_usage_ns(s) for s in session_ids]
    host_after = host_busy_jiffies()
    per_session = [(b - a) / 1e9 / window_s * 100 for a, b in zip(before, after, strict=True)]
    busy = host_after[0] - host_before[0]
    total = host_after[1] - host_before[1]
    return statistics.mean(per_session), 100 * busy / max(1, total)


# -- the sessions ------------------------------------------------------------------------


def ws_timings(ws: ClientConnection, action: dict[str, object], iterations: int) -> list[float]:
    """Round trips of ``action``; a screenshot's captured and encoded each time
    (bench/api.py ``fresh_looks``)."""
    counter = [0]
    next_action = bench_api.each_time(action)
    return bench_api.timed(lambda: bench_api.ws_call(ws, counter, next_action()), iterations,
                           warmup=3)


@dataclass
class Step:
    sessions: int
    pss_mean_mib: float
    pss_added_mib: float | None
    agent_pss_mib: float
    cgroup_mib: float | None
    server_pss_mib: float
    available_drop_mib: float
    cpu_per_session: float
    host_busy: float
    shot: list[float]
    click: list[float]


class Density:
    def __init__(self, http: httpx.Client, args: argparse.Namespace) -> None:
        self.http = http
        self.args = args
        self.sessions: list[str] = []
        self.server = bench_api.server_pid(http)
        self.baseline = mem_available()
        self.steps: list[Step] = []
        self.stopped: str | None = None  # why fewer sessions than asked

    def grow_to(self, count: int) -> bool:
        """Add sessions up to ``count``; False if the memory guard stopped it first."""
        floor = self.args.min_available_gib * GIB
        while len(self.sessions) < count:
            available = mem_available()
            if available < floor:
                self.stopped = (
                    f"memory guard: stopped at {len(self.sessions)} sessions, MemAvailable "
                    f"{available / GIB:.1f} GiB < {self.args.min_available_gib:g} GiB")
                progress(self.stopped)
                return False
            started = time.perf_counter()
            try:
                self.sessions.append(bench_api.create(self.http, self.args.start_url))
            except httpx.HTTPStatusError as error:
                self.stopped = (f"create refused at {len(self.sessions)} sessions:"
                                f" {error.response.status_code} {error.response.text[:200]}")
                progress(self.stopped)
                return False
            progress(f"session {len(self.sessions)}/{count} up in"
                     f" {time.perf_counter() - started:.1f} s"
                     f" (MemAvailable {available / GIB:.1f} GiB)")
        return True

    def delete_all(self) -> None:
        for session_id in self.sessions:
            try:
                self.http.delete(f"/v1/sessions/{session_id}")
            except httpx.HTTPError as error:
                progress(f"could not delete {session_id}: {error}")
        self.sessions.clear()

    def measure(self, ws: ClientConnection) -> Step:
        count = len(self.sessions)
        progress(f"{count} sessions: idle {self.args.idle_s} s, then measuring...")
        time.sleep(self.args.idle_s)
        pss = sum(bench_api.pss_mib(s) for s in self.sessions)
        previous = self.steps[-1] if self.steps else None
        added = None
        if previous is not None and count > previous.sessions:
            before = previous.pss_mean_mib * previous.sessions
            added = (pss - before) / (count - previous.sessions)
        charged = [cgroup_memory(s) for s in self.sessions]
        cgroup = None if None in charged else sum(filter(None, charged)) / count / 2**20
        cpu, busy = idle_cpu(self.sessions, self.args.cpu_window_s)
        step = Step(
            sessions=count,
            pss_mean_mib=pss / count,
            pss_added_mib=added,
            agent_pss_mib=sum(agent_pss_kib(s) for s in self.sessions) / count / 1024,
            cgroup_mib=cgroup,
            server_pss_mib=pss_kib(self.server) / 1024,
            available_drop_mib=(self.baseline - mem_available()) / count / 2**20,
            cpu_per_session=cpu,
            host_busy=busy,
            shot=ws_timings(ws, SHOT, self.args.iterations),
            click=ws_timings(ws, CLICK, self.args.iterations),
        )
        self.steps.append(step)
        progress(f"{count} sessions: PSS {step.pss_mean_mib:.0f} MiB each, idle CPU"
                 f" {cpu:.1f} % each, screenshot p50"
                 f" {statistics.median(step.shot) * 1000:.1f} ms")
        return step


def run(http: httpx.Client, args: argparse.Namespace) -> Density:
    density = Density(http, args)
    try:
        if not density.grow_to(1):
            return density
        first = density.sessions[0]
        url = (f"ws{str(http.base_url).removeprefix('http').rstrip('/')}"
               f"/v1/sessions/{first}/actions/ws")
        with connect(url, additional_headers={"Authorization": f"Bearer {bench_api.KEY}"},
                     compression=None, max_size=None) as ws:
            for count in args.steps:
                grown = density.grow_to(count)
                if not density.steps or density.steps[-1].sessions != len(density.sessions):
                    density.measure(ws)
                if not grown:
                    break
    finally:
        progress(f"deleting {len(density.sessions)} sessions...")
        density.delete_all()
    return density


# -- the table ---------------------------------------------------------------------------


def _p(samples: Sequence[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} / {bench_api.p95(samples) * 1000:.1f}"


def render(density: Density, args: argparse.Namespace) -> list[str]:
    lines = [
        "## Density: idle sessions on this host (container backend, 1280x800)\n",
        "| sessions | PSS per session MiB | PSS added per session MiB "
        "| agent PSS per session MiB | cgroup memory per session MiB | server PSS MiB "
        "| MemAvailable drop per session MiB | idle CPU per session % of a core "
        "| host CPU busy % | session 1 ws screenshot p50 / p95 ms | ws click p50 / p95 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for step in density.steps:
        added = "–" if step.pss_added_mib is None else f"{step.pss_added_mib:.0f}"
        cgroup = "–" if step.cgroup_mib is None else f"{step.cgroup_mib:.0f}"
        lines.append(
            f"| {step.sessions} | {step.pss_mean_mib:.0f} | {added}"
            f" | {step.agent_pss_mib:.1f} | {cgroup} "
            f"| {step.server_pss_mib:.0f} "
            f"| {step.available_drop_mib:.0f} | {step.cpu_per_session:.1f} "
            f"| {step.host_busy:.0f} | {_p(step.shot)} | {_p(step.click)} |")
    return lines


def projections(density: Density) -> list[str]:
    if not density.steps:
        return ["- No step was measured."]
    last = density.steps[-1]
    marginal = last.pss_added_mib or last.pss_mean_mib
    lines = [
        f"- Projected sessions per {PROJECT_GIB} GiB: {PROJECT_GIB * 1024 / marginal:.0f} by the"
        f" PSS added per session at the last step ({marginal:.0f} MiB),"
        f" {PROJECT_GIB * 1024 / max(1.0, last.available_drop_mib):.0f} by the host's"
        f" MemAvailable drop ({last.available_drop_mib:.0f} MiB per session, server and page"
        " cache included; meaningful only when nothing else on the host changes its memory).",
    ]
    cores = os.cpu_count() or 1
    if last.cpu_per_session > 0:
        lines.append(
            f"- CPU: idle sessions use {last.cpu_per_session:.1f} % of a core each, so idle"
            f" load alone fills {cores} cores at ≈ {cores * 100 / last.cpu_per_session:.0f}"
            " sessions (before any agent acts).")
    base = statistics.median(density.steps[0].shot)
    blown = [s for s in density.steps if statistics.median(s.shot) > BLOW_UP * base]
    if blown:
        lines.append(f"- Session 1's screenshot p50 first exceeded {BLOW_UP:g}× its 1-session"
                     f" value at {blown[0].sessions} sessions.")
    else:
        lines.append(f"- Session 1's screenshot p50 stayed within {BLOW_UP:g}× its 1-session"
                     " value at every step.")
    if density.stopped:
        lines.append(f"- Fewer sessions than asked: {density.stopped}.")
    return lines


def parse_steps(text: str) -> list[int]:
    steps = sorted({int(part) for part in text.split(",") if part.strip()})
    if not steps or steps[0] < 1:
        raise argparse.ArgumentTypeError("steps are positive session counts, e.g. 1,5,10")
    return steps


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--steps", type=parse_steps, default=[1, 5, 10, 20, 40])
    parser.add_argument("--iterations", type=int, default=50, help="round trips per step")
    parser.add_argument("--idle-s", type=float, default=10.0, help="quiet before measuring")
    parser.add_argument("--cpu-window-s", type=float, default=5.0)
    parser.add_argument("--min-available-gib", type=float, default=3.0)
    parser.add_argument("--start-url", default=bench_api.PAINTED_PAGE)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/density.py needs root (runc sandboxes)")
    bench_api.interrupt_on_sigterm()
    limit = str(max(args.steps) + 1)
    env = {"DESKBOX_MAX_SESSIONS": limit, "DESKBOX_MAX_SESSIONS_PER_KEY": limit,
           "DESKBOX_BACKENDS": "container", "DESKBOX_DEFAULT_BACKEND": "container"}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-density-") as tmp, \
            bench_api.server(Path(tmp) / "state", env) as http:
        density = run(http, args)
    print("\n".join(render(density, args)))
    print()
    print("\n".join(projections(density)))
    print(f"- Command: `.venv/bin/python bench/density.py --steps"
          f" {','.join(map(str, args.steps))} --iterations {args.iterations} --idle-s"
          f" {args.idle_s:g}`; start page {json.dumps(args.start_url[:40])}…; each sandbox"
          " capped at 1 CPU (the default).")
    print(f"- {os.cpu_count()} CPUs, {mem_total_gib():.0f} GiB; 1-minute load average"
          f" {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (other work on the host"
          " skews the figures).")
    return 0


def mem_total_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return 0.0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("[density] interrupted; "
              "every session was deleted and the server stopped", file=sys.stderr)
        sys.exit(130)
