"""Sandbox start and destroy times of the container backend (runc, the session image).

    .venv/bin/python bench/container_start.py [--runs 10] [--cpus 1.0] [--no-browser]

Stages, each measured from the start of ``RuncSandbox.start``: ``runc`` (runc run
--detach returned), ``socket`` (the X socket appeared), ``xserver`` (connected), ``wm``
(openbox owns WM_S0), ``browser`` (Chromium's window is viewable), ``painted`` (its
toolbar is drawn); then ``destroy``. Needs root; builds the image first if it is missing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from deskbox_server.engines.image import build_image  # noqa: E402
from deskbox_server.engines.processes import become_subreaper  # noqa: E402
from deskbox_server.engines.runc.layout import Limits  # noqa: E402
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox  # noqa: E402
from deskbox_server.settings import Settings, default_recipe_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument("--image-state-dir", type=Path, default=Settings().image_cache_dir,
                        help="the image cache (default: the server's)")
    args = parser.parse_args()
    become_subreaper()  # sandbox inits reparent to us when runc exits: we reap them
    rootfs = build_image(
        args.image_state_dir, default_recipe_dir(), lambda line: print(line, file=sys.stderr)
    )
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-") as state:
        options = RuncOptions(state_dir=Path(state), rootfs=rootfs)
        rows: list[dict[str, float]] = []
        for run in range(args.runs):
            box = RuncSandbox.start(
                options, f"bench-{os.getpid()}-{run}", limits=Limits(cpus=args.cpus),
                browser=not args.no_browser,
            )
            started = time.monotonic()
            box.destroy()
            rows.append({**box.timings, "destroy": time.monotonic() - started})
    print(f"{args.runs} runs, cpus={args.cpus}, browser={not args.no_browser} (ms)")
    for stage in rows[0]:
        values = sorted(row[stage] * 1000 for row in rows)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        print(f"  {stage:8} median {statistics.median(values):7.0f}   p95 {p95:7.0f}")


if __name__ == "__main__":
    main()
