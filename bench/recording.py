"""What recording costs the agent (issue 19: at most 10 % on screenshot or click p50), on
the container backend.

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/recording.py [--rounds 5] [--iterations 40]

One ``deskbox serve`` and two sessions on the same page, one recorded (``"record": true``)
and one not. Every click toggles the page's colour, so each one damages the screen and the
recording takes frames (at most 4 a second, captured and encoded by the session's agent)
while the agent clicks and looks. In ``--rounds`` rounds, each session in turn gets
``--iterations`` REST clicks, then as many REST JPEG screenshots, so that a drift of the
host hits both alike. Prints a markdown table (median and p95 in ms, the recorded
session's median over the plain one's) and what the recording kept. Every session and
recording is deleted and the server stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from api import HEIGHT, WIDTH, fresh_looks, interrupt_on_sigterm, p95, server, timed

# A click anywhere flips the page between two colours: every click changes the screen.
PAGE = ("data:text/html,<body style='margin:0;height:100vh;background:%23e0e0ff' "
        "onclick=\"this.style.background=this.style.background=='red'?'%23e0e0ff':'red'\">"
        "<h1>recording bench</h1></body>")
CLICK = {"type": "click", "x": 640, "y": 400}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=40, help="calls per kind and round")
    parser.add_argument("--fps", type=float, default=None,
                        help="DESKBOX_RECORDING_FPS for the server (default: its own, 4)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/recording.py needs root (runc sandboxes)")
    interrupt_on_sigterm()
    variants = {"not recorded (baseline)": False, "recorded": True}
    samples: dict[tuple[str, str], list[float]] = {
        (name, kind): [] for name in variants for kind in ("click", "screenshot")}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-recording-") as tmp, \
            server(Path(tmp) / "state", extra_env=(
                {"DESKBOX_RECORDING_FPS": str(args.fps)} if args.fps else None)) as http:
        ids: dict[str, str] = {}
        try:
            for name, record in variants.items():
                response = http.post("/v1/sessions", json={
                    "display": {"width": WIDTH, "height": HEIGHT}, "record": record,
                    "browser": {"start_url": PAGE}})
                response.raise_for_status()
                ids[name] = response.json()["id"]
            for run in range(args.rounds):
                print(f"measuring: round {run + 1} of {args.rounds}...", file=sys.stderr)
                for name, session_id in ids.items():
                    base = f"/v1/sessions/{session_id}"
                    looks = fresh_looks({"format": "jpeg"})  # each captured and encoded

                    def click(base: str = base) -> object:
                        return http.post(f"{base}/actions", json=CLICK).raise_for_status()

                    def look(base: str = base, looks: Callable[[], dict[str, Any]] = looks,
                             ) -> object:
                        return http.get(f"{base}/screenshot", params=looks()).raise_for_status()

                    samples[name, "click"] += timed(click, args.iterations)
                    samples[name, "screenshot"] += timed(look, args.iterations)
            recording = http.get(f"/v1/sessions/{ids['recorded']}/recording").json()
        finally:
            for session_id in ids.values():
                http.delete(f"/v1/sessions/{session_id}")
                http.delete(f"/v1/sessions/{session_id}/recording")
    print("| REST call | not recorded, ms: median (p95) | recorded, ms: median (p95) | ratio |")
    print("|---|---|---|---|")
    for kind in ("click", "screenshot"):
        plain, recorded = samples["not recorded (baseline)", kind], samples["recorded", kind]
        ratio = _median(recorded) / _median(plain)
        print(f"| {kind} | {_ms(plain)} | {_ms(recorded)} | {ratio:.2f}× |")
    print(f"\nThe recording kept {recording['actions']} actions and {recording['frames']} "
          f"frames ({recording['bytes'] / 2**20:.1f} MiB) over "
          f"{args.rounds * args.iterations * 2} calls.")
    return 0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _ms(values: Sequence[float]) -> str:
    return f"{_median(values) * 1000:.1f} ({p95(values) * 1000:.1f})"


if __name__ == "__main__":
    raise SystemExit(main())
