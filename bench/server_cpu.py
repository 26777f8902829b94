"""Where the work of driving a session runs: the server's CPU per 1,000 actions, before/after.

Run from the repository root (root, runc; builds the session images first if missing)::

    .venv/bin/python bench/server_cpu.py [--baseline REF] [--actions 1000]

For each server measured, it starts ``deskbox serve`` (bench/api.py's helper) on one
1280x800 session, then sends ``--actions`` screenshots (JPEG q75/74 in turn, then PNG: each
captured and encoded, see bench/api.py ``fresh_looks``) and clicks over
one actions websocket, one in flight, and reads the CPU seconds the server process spent
meanwhile (``utime + stime`` of ``/proc/PID/stat``, every thread included) and the
session's own (its cgroup's ``cpuacct.usage``): the issue of the desktop agent moves the
capture and encoding from the first into the second.

``--baseline REF`` (for example the last commit before a change) measures that commit's
server too, in the same run: a detached git worktree of REF, imported first through
PYTHONPATH, with the same virtualenv and image cache (its own recipe hash builds its own
image). It prints one table with both servers side by side and the ratio. The worktree is
removed on exit; every session is deleted and every server stopped.
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench")]

import api as bench_api  # noqa: E402 (bench/api.py: the server helper)
import httpx  # noqa: E402
from agent_desktop import text_page  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OPERATIONS: dict[str, dict[str, object]] = {
    "screenshot JPEG q75": bench_api.SHOT,
    "screenshot PNG": {"type": "screenshot", "format": "png"},
    "click": bench_api.CLICK,
}


@dataclass(frozen=True)
class Figure:
    server_cpu_s_per_1000: float
    session_cpu_s_per_1000: float
    p50_ms: float
    p95_ms: float


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


def session_cpu_s(session_id: str) -> float:
    """The session's cgroup CPU time (cgroup v1 cpuacct; 0 where the session has none)."""
    for usage in Path("/sys/fs/cgroup").glob(f"cpu*/deskbox-*{session_id}/cpuacct.usage"):
        return int(usage.read_text()) / 1e9
    return 0.0


def page_url(page: str) -> str:
    """The session's page: one colour (small frames) or a page of text (~300 KiB each)."""
    if page == "text":
        return "data:text/html;base64," + base64.b64encode(text_page().encode()).decode()
    return bench_api.PAINTED_PAGE


def measure(http: httpx.Client, actions: int, progress: Callable[[str], None],
            page: str = "painted") -> dict[str, Figure]:
    pid = bench_api.server_pid(http)
    session_id = bench_api.create(http, page_url(page))
    figures: dict[str, Figure] = {}
    try:
        base = f"/v1/sessions/{session_id}"
        url = f"ws{str(http.base_url).removeprefix('http').rstrip('/')}{base}/actions/ws"
        with connect(url, additional_headers={"Authorization": f"Bearer {bench_api.KEY}"},
                     compression=None, max_size=None) as ws:
            counter = [0]
            for name, request in OPERATIONS.items():
                progress(f"  {actions} × {name}")
                action = bench_api.each_time(request)  # every look captured and encoded
                for _ in range(20):
                    bench_api.ws_call(ws, counter, action())
                server_before, session_before = process_cpu_s(pid), session_cpu_s(session_id)
                samples = []
                for _ in range(actions):
                    started = time.perf_counter()
                    bench_api.ws_call(ws, counter, action())
                    samples.append(time.perf_counter() - started)
                scale = 1000 / actions
                figures[name] = Figure(
                    (process_cpu_s(pid) - server_before) * scale,
                    (session_cpu_s(session_id) - session_before) * scale,
                    statistics.median(samples) * 1000, bench_api.p95(samples) * 1000,
                )
    finally:
        http.delete(f"/v1/sessions/{session_id}")
    return figures


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-baseline-") as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(path),
                        ref], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)],
                           check=False)


def run_server(label: str, tree: Path | None, actions: int, page: str,
               ) -> dict[str, Figure]:
    def progress(message: str) -> None:
        print(f"[{label}] {message}", file=sys.stderr, flush=True)

    extra = {} if tree is None else {"PYTHONPATH": f"{tree / 'server'}"}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-cpu-") as tmp, \
            bench_api.server(Path(tmp) / "state", extra) as http:
        progress("server ready")
        return measure(http, actions, progress, page)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", metavar="REF", help="a commit to measure beside this tree")
    parser.add_argument("--actions", type=int, default=1000, help="of each kind")
    parser.add_argument("--quick", action="store_true", help="100 actions of each kind")
    parser.add_argument("--page", choices=("painted", "text"), default="painted",
                        help="one colour (default), or a page of text: frames ten times larger")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/server_cpu.py needs root (runc sandboxes)")
    actions = 100 if args.quick else args.actions
    bench_api.interrupt_on_sigterm()
    runs: dict[str, dict[str, Figure]] = {}
    if args.baseline:
        with worktree(args.baseline) as tree:
            runs[f"baseline {args.baseline}"] = run_server("baseline", tree, actions,
                                                           args.page)
    runs["this tree"] = run_server("this tree", None, actions, args.page)

    print(f"## Server and session CPU per 1,000 actions, {bench_api.WIDTH}x{bench_api.HEIGHT}, "
          f"one websocket, {args.page} page\n")
    print("| action | server | server CPU s / 1000 | session CPU s / 1000 | p50 ms | p95 ms |")
    print("|---|---|---:|---:|---:|---:|")
    for name in OPERATIONS:
        for label, figures in runs.items():
            figure = figures[name]
            print(f"| {name} | {label} | {figure.server_cpu_s_per_1000:.2f} | "
                  f"{figure.session_cpu_s_per_1000:.2f} | {figure.p50_ms:.1f} | "
                  f"{figure.p95_ms:.1f} |")
    if len(runs) == 2:
        before, after = runs.values()
        print("\n| action | server CPU before / after | p50 before / after |")
        print("|---|---:|---:|")
        for name in OPERATIONS:
            cpu = before[name].server_cpu_s_per_1000 / max(after[name].server_cpu_s_per_1000,
                                                           1e-9)
            p50 = before[name].p50_ms / max(after[name].p50_ms, 1e-9)
            print(f"| {name} | {cpu:.1f}× | {p50:.2f}× |")
    print(f"\n- {os.cpu_count()} CPUs; {actions} actions of each kind after 20 warm-up ones; "
          "server CPU = the server process's utime+stime (all threads).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
