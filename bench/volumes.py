"""Sessions with persistent volumes and browser profiles (issue 20), on the container backend.

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/volumes.py [--runs 5]

One ``deskbox serve`` (no warm pool: every create is a cold start), and in turn, ``--runs``
times each, interleaved so that a drift of the host hits every variant alike:

- a create with no volume (the baseline);
- a create with an empty 1 GiB volume mounted at /root/work;
- a create with a browser profile (a volume the first session filled: Chromium's profile
  of a visited page);

each timed from ``POST /v1/sessions`` to a screenshot showing its start page painted, and
its ``DELETE`` (a session with volumes asks its browser to close first, so that the profile
is written). Prints a markdown table (median, p95, ratio to the baseline of the same run).
Every session and volume is deleted and the server stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from api import HEIGHT, PAINTED_PAGE, WIDTH, cell, interrupt_on_sigterm, server, wait_painted

VARIANTS: dict[str, dict[str, Any]] = {
    "no volume (baseline)": {},
    "an empty 1 GiB volume at /root/work": {"volumes": [{"name": "work", "path": "/root/work"}]},
    "a browser profile (a filled volume)": {"browser": {"profile": "bench"}},
}


def create_painted_delete(http: httpx.Client, extra: dict[str, Any]) -> tuple[float, float]:
    """Seconds from the create to its start page painted, and of its delete."""
    browser = {"start_url": PAINTED_PAGE, **extra.get("browser", {})}
    started = time.perf_counter()
    response = http.post("/v1/sessions", json={
        **extra, "display": {"width": WIDTH, "height": HEIGHT}, "browser": browser})
    response.raise_for_status()
    session_id = response.json()["id"]
    try:
        painted = wait_painted(http, session_id, started)
    finally:
        started = time.perf_counter()
        http.delete(f"/v1/sessions/{session_id}").raise_for_status()
    return painted, time.perf_counter() - started


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="creates per variant")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/volumes.py needs root (runc sandboxes, loop mounts)")
    interrupt_on_sigterm()
    painted: dict[str, list[float]] = {name: [] for name in VARIANTS}
    deleted: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-volumes-") as tmp, \
            server(Path(tmp) / "state") as http:
        http.post("/v1/volumes", json={"name": "work", "size_mb": 1024}).raise_for_status()
        create_painted_delete(http, VARIANTS["a browser profile (a filled volume)"])  # fills it
        for run in range(args.runs):
            print(f"measuring: round {run + 1} of {args.runs}...", file=sys.stderr)
            for name, extra in VARIANTS.items():
                up, down = create_painted_delete(http, extra)
                painted[name].append(up)
                deleted[name].append(down)
        used = http.get("/v1/volumes/bench").json()["used_bytes"]
        for name in ("work", "bench"):
            http.delete(f"/v1/volumes/{name}")
    baseline = statistics.median(painted["no volume (baseline)"])
    print("| session | create → painted, s: median (p95) | ratio | delete, s: median (p95) |")
    print("|---|---|---|---|")
    for name in VARIANTS:
        ratio = statistics.median(painted[name]) / baseline
        print(f"| {name} | {cell(painted[name])} | {ratio:.2f}× | {cell(deleted[name])} |")
    print(f"\nThe profile volume held {used / 2**20:.1f} MiB after {args.runs + 1} sessions.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
