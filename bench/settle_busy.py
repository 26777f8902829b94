"""Settled screenshots while a session's commands take its CPU: right, and how long.

Run from the repository root (root, runc; builds the session images first if missing)::

    .venv/bin/python bench/settle_busy.py [--loops 0,2,6] [--clicks 60] [--baseline REF]

For each server measured (``--baseline REF``: that commit's too, from a worktree, as
bench/server_cpu.py does) and each count of busy loops, it starts one 1280x800 session of
one CPU on a page that turns from green to red and back at each click, starts that many
``while :; do :; done`` in it (``exec``, in the background), then sends ``--clicks`` clicks,
each with a settled PNG screenshot (``POST /actions``), 0.2 s apart (an agent's model
turn). A screenshot that says ``settled: true`` but shows the page's colour before the
click is a miss (the page is then watched until it shows the click, so that the next
click starts even). It prints, per server and loops: misses, ``settled: false`` answers,
and the p50 / p95 of the whole request. Every session is deleted and every server stopped.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import api as bench_api
import httpx
from PIL import Image
from server_cpu import worktree

PAGE = "data:text/html," + quote(
    "<body style='margin:0;background:#0a0' onclick=\"window.n = (window.n || 0) + 1;"
    "document.body.style.background = window.n % 2 ? '#d00' : '#0a0'\"></body>")
TURN_S = 0.2
Row = tuple[int, int, float, float]  # misses, unsettled, p50 ms, p95 ms


def red(png: bytes) -> bool:
    pixel = Image.open(io.BytesIO(png)).convert("RGB").getpixel((640, 600))
    assert isinstance(pixel, tuple)
    return bool(pixel[0] > 150)


def shows(http: httpx.Client, session_id: str, want_red: bool, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shot = http.get(f"/v1/sessions/{session_id}/screenshot", params={"format": "png"})
        shot.raise_for_status()
        if red(shot.content) is want_red:
            return True
        time.sleep(0.05)
    return False


def measure(http: httpx.Client, loops: int, clicks: int) -> Row:
    created = http.post("/v1/sessions", json={
        "display": {"width": 1280, "height": 800}, "browser": {"start_url": PAGE},
        "resources": {"cpus": 1}})
    created.raise_for_status()
    session_id = created.json()["id"]
    try:
        if not shows(http, session_id, False, 30):
            raise SystemExit("the page was not painted within 30 s")
        for _ in range(loops):
            http.post(f"/v1/sessions/{session_id}/exec", json={
                "cmd": ["sh", "-c", "while :; do :; done"], "background": True,
            }).raise_for_status()
        misses = unsettled = 0
        times = []
        for click in range(1, clicks + 1):
            time.sleep(TURN_S)
            started = time.perf_counter()
            reply = http.post(f"/v1/sessions/{session_id}/actions", json={
                "actions": [{"type": "click", "x": 640, "y": 400}],
                "screenshot": {"format": "png"}})
            times.append(time.perf_counter() - started)
            reply.raise_for_status()
            body = reply.json()
            want_red = click % 2 == 1
            if not body["settled"]:
                unsettled += 1
            elif red(base64.b64decode(body["screenshot"]["data_b64"])) is not want_red:
                misses += 1
            if not shows(http, session_id, want_red, 10):
                raise SystemExit(f"click {click} never showed")
        return misses, unsettled, statistics.median(times) * 1000, bench_api.p95(times) * 1000
    finally:
        http.delete(f"/v1/sessions/{session_id}")


def run_server(label: str, tree: Path | None, loop_counts: list[int],
               clicks: int) -> dict[int, Row]:
    extra = {} if tree is None else {"PYTHONPATH": f"{tree / 'server'}"}
    rows = {}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-settle-") as tmp, \
            bench_api.server(Path(tmp) / "state", extra) as http:
        for loops in loop_counts:
            print(f"[{label}] {loops} busy loops, {clicks} clicks", file=sys.stderr, flush=True)
            rows[loops] = measure(http, loops, clicks)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="0,2,6", help="busy loop counts, comma-separated")
    parser.add_argument("--clicks", type=int, default=60)
    parser.add_argument("--baseline", metavar="REF", help="a commit to measure beside this tree")
    parser.add_argument("--quick", action="store_true", help="10 clicks")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/settle_busy.py needs root (runc sandboxes)")
    loop_counts = [int(n) for n in args.loops.split(",")]
    clicks = 10 if args.quick else args.clicks
    bench_api.interrupt_on_sigterm()
    runs: dict[str, dict[int, Row]] = {}
    if args.baseline:
        with worktree(args.baseline) as tree:
            runs[f"baseline {args.baseline}"] = run_server("baseline", tree, loop_counts, clicks)
    runs["this tree"] = run_server("this tree", None, loop_counts, clicks)
    print(f"## A click with a settled screenshot while busy loops take the session's CPU "
          f"(1 CPU, {clicks} clicks {TURN_S} s apart)\n")
    print("| busy loops | server | screenshots before the click | `settled: false` "
          "| p50 ms | p95 ms |")
    print("|---:|---|---:|---:|---:|---:|")
    for loops in loop_counts:
        for label, rows in runs.items():
            misses, unsettled, p50, p95 = rows[loops]
            print(f"| {loops} | {label} | {misses} | {unsettled} | {p50:.0f} | {p95:.0f} |")
    print(f"\n- Command: `.venv/bin/python bench/settle_busy.py --loops {args.loops} --clicks "
          f"{clicks}{' --baseline ' + args.baseline if args.baseline else ''}`; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} after the run.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
