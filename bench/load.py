"""Load: many agents driving many sessions at once over the actions websocket.

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/load.py [--clients 20] [--actions 1000] [--sessions 10] [--page flat]

It starts ``deskbox serve`` (bench/api.py's helper; container backend, session limits
raised), creates ``--sessions`` 1280x800 sessions showing a page that is one big text area,
then runs ``--clients`` clients at once (client i on session i mod N, two per session by
default), each with one websocket and ``--actions`` actions one after another: 40 %
screenshots (JPEG q75), 40 % clicks in the page, 20 % typing 4-12 characters
(``tests/load_client.py``, which also checks every reply). ``--page flat`` shows the same
text area drawn by the page instead of Chromium's native theme, which a click makes
Chromium repaint whole (bench/README.md, "Load"). It prints the latency of each action kind
(send to the whole reply, frames included) as p50/p95/p99/max, the error count (anything
but the reply the protocol promises; must be 0, else the exit status is 1), the
throughput, and the server process's RSS before and after. Every session is deleted and the
server stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import api as bench_api  # noqa: E402 (bench/api.py: the server helper)

from tests.load_client import (  # noqa: E402
    FLAT_TEXT_PAGE,
    KINDS,
    TEXT_PAGE,
    LoadResult,
    percentile,
    run_load,
)

WIDTH, HEIGHT = 1280, 800
PAGES = {"textarea": TEXT_PAGE, "flat": FLAT_TEXT_PAGE}


def progress(message: str) -> None:
    print(f"[load] {message}", file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float:
    return bench_api.status_field(pid, "VmRSS") / 1024


def table(result: LoadResult, clients: int, sessions: int, rss: tuple[float, float],
          page: str) -> str:
    lines = [
        f"## Load: {clients} clients x {result.actions // max(clients, 1)} actions over "
        f"{sessions} sessions ({WIDTH}x{HEIGHT}, page `{page}`, actions websocket, one request "
        "in flight per client)\n",
        "| action | n | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        samples = result.latencies[kind]
        if not samples:
            lines.append(f"| {kind} | 0 | – | – | – | – |")
            continue
        p50, p95, p99 = (percentile(samples, f) * 1000 for f in (0.50, 0.95, 0.99))
        lines.append(f"| {kind} | {len(samples)} | {p50:.1f} | {p95:.1f} | {p99:.1f} | "
                     f"{max(samples) * 1000:.1f} |")
    load = os.getloadavg()
    lines += [
        "",
        f"- errors: **{len(result.errors)}** (of {result.actions} actions answered)",
        f"- wall time {result.seconds:.1f} s; throughput {result.actions / result.seconds:.0f} "
        "actions/s",
        f"- server RSS {rss[0]:.0f} MiB before, {rss[1]:.0f} MiB after",
        f"- {os.cpu_count()} CPUs; load average after the run {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} (1/5/15 min); clients and server are separate processes on loopback",
    ]
    lines += [f"- error: {error}" for error in result.errors[:10]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--actions", type=int, default=1000, help="per client")
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--page", choices=PAGES, default="textarea",
                        help="the text area drawn by Chromium's native theme, or by the page")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/load.py needs root (runc sandboxes)")
    limits = {"DESKBOX_MAX_SESSIONS": str(args.sessions + 2),
              "DESKBOX_MAX_SESSIONS_PER_KEY": str(args.sessions + 2)}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-load-") as tmp, \
            bench_api.server(Path(tmp) / "state", limits) as http:
        pid = bench_api.server_pid(http)
        sessions: list[str] = []
        try:
            for n in range(args.sessions):
                progress(f"creating session {n + 1}/{args.sessions}")
                sessions.append(bench_api.create(http, PAGES[args.page]))
            time.sleep(2)  # the pages settle before the clock starts
            base = f"ws{str(http.base_url).removeprefix('http').rstrip('/')}"
            urls = [f"{base}/v1/sessions/{sid}/actions/ws" for sid in sessions]
            before = rss_mib(pid)
            progress(f"{args.clients} clients x {args.actions} actions")
            result = asyncio.run(run_load(
                urls, {"Authorization": f"Bearer {bench_api.KEY}"}, args.clients,
                args.actions, (WIDTH, HEIGHT), seed=args.seed,
            ))
            after = rss_mib(pid)
        finally:
            for session_id in sessions:
                http.delete(f"/v1/sessions/{session_id}")
    print(table(result, args.clients, args.sessions, (before, after), args.page))
    return 1 if result.errors or result.actions != args.clients * args.actions else 0


if __name__ == "__main__":
    sys.exit(main())
