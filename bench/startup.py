"""Session start-up: ``POST /v1/sessions`` → first screenshot showing the start page painted.

Run from the repository root (root and runc for the default container backend)::

    .venv/bin/python bench/startup.py [--runs 5] [--backend container|local] [--pool-size 2]

It starts ``deskbox serve`` (bench/api.py's helper) on a free loopback port and measures, over
REST, from sending ``POST /v1/sessions`` to its response, and to the first ``GET /screenshot``
that shows the page painted:

- cold, start page: ``browser.start_url`` is a ``data:`` page of one known colour, and the
  screenshot must show that colour; each create starts a fresh sandbox;
- cold, default create: nothing but the display size (1280x800, the default), so the start
  page is ``about:blank`` and the screenshot must show its white page; a fresh sandbox each;
- warm pool (HOOK below): the default create again, on a second server started with
  ``DESKBOX_POOL_SIZE`` (Settings field ``pool_size``), once its pool is full again. The
  pool only serves creates that ask for nothing else (docs/API.md, "Warm pool"): a create
  with a start page starts cold. Servers without that setting get a row saying so.

Every session is deleted and every server stopped on exit (Ctrl-C too).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import api as bench_api  # bench/api.py (this script's directory): the server helper
import httpx
from PIL import Image

from deskbox_server.settings import Settings

PAINT_TIMEOUT_S = 30.0
# Screenshots while waiting for the page: small, so polling costs the desktop little.
POLL_SHOT: dict[str, str | int] = {"format": "jpeg", "quality": 50, "scale": "320x200"}


def progress(message: str) -> None:
    print(f"[startup] {message}", file=sys.stderr, flush=True)


@dataclass
class Runs:
    created: list[float] = field(default_factory=list)
    painted: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Kind:
    """What a create asks for, and how a screenshot shows its start page painted."""

    label: str
    start_url: str
    painted: Callable[[bytes], bool]


def shows_white(data: bytes) -> bool:
    """about:blank painted: the page area is white (before that it is not drawn)."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    pixel = image.getpixel((image.width // 2, image.height * 3 // 4))
    assert isinstance(pixel, tuple)
    return all(int(p) >= 245 for p in pixel)


START_PAGE = Kind("start page", bench_api.PAINTED_PAGE, bench_api.shows_colour)
# The API's defaults (about:blank, 1280x800): what the warm pool serves.
DEFAULT = Kind("default create", "about:blank", shows_white)


def one_start(http: httpx.Client, kind: Kind) -> tuple[float, float]:
    """Seconds from POST to its response, and to a screenshot showing the start page."""
    started = time.perf_counter()
    session_id = bench_api.create(http, kind.start_url)
    created = time.perf_counter() - started
    try:
        while True:
            shot = http.get(f"/v1/sessions/{session_id}/screenshot", params=POLL_SHOT)
            shot.raise_for_status()
            if kind.painted(shot.content):
                return created, time.perf_counter() - started
            if time.perf_counter() - started > PAINT_TIMEOUT_S:
                raise SystemExit(f"the start page was not painted within {PAINT_TIMEOUT_S} s")
    finally:
        http.delete(f"/v1/sessions/{session_id}")


def measure(http: httpx.Client, runs: int, label: str, kind: Kind,
            before_each: Callable[[], None] | None = None) -> Runs:
    result = Runs()
    for run in range(runs):
        if before_each is not None:
            before_each()
        created, painted = one_start(http, kind)
        result.created.append(created)
        result.painted.append(painted)
        progress(f"{label}, {kind.label} {run + 1}/{runs}: POST {created * 1000:.0f} ms,"
                 f" painted {painted * 1000:.0f} ms")
    return result


# -- warm pool ---------------------------------------------------------------------------
# HOOK (issue 8, warm pool; sessions/pool.py): this part needs only the server setting
# (DESKBOX_POOL_SIZE / Settings.pool_size) and, to know when the pool is full again, a gauge
# in /metrics named deskbox_pool_* with "ready", "idle", "available" or "warm" in its name.
# Without such a gauge it waits --pool-fill-s after the server starts and before each create.

_READY_WORDS = ("ready", "idle", "available", "warm")


def pool_available() -> bool:
    return "pool_size" in Settings.model_fields


def pool_metrics(http: httpx.Client) -> list[str]:
    response = http.get("/metrics")
    if response.status_code != 200:
        return []
    return [line for line in response.text.splitlines() if line.startswith("deskbox_pool")]


def ready_in_pool(http: httpx.Client) -> int | None:
    """Sessions waiting in the pool per /metrics, or None if no gauge says so."""
    for line in pool_metrics(http):
        name, _, value = line.partition(" ")
        if any(word in name.split("{")[0] for word in _READY_WORDS):
            return int(float(value))
    return None


def wait_pool_full(http: httpx.Client, size: int, fallback_s: float) -> None:
    if ready_in_pool(http) is None:
        time.sleep(fallback_s)
        return
    deadline = time.monotonic() + 120
    while (ready_in_pool(http) or 0) < size:
        if time.monotonic() > deadline:
            raise SystemExit(f"the warm pool did not reach {size} ready sessions in 120 s")
        time.sleep(0.1)


def measure_pool(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> Runs | str:
    if not pool_available():
        return "warm pool: not available on this server (no Settings.pool_size)"
    pool_env = {**env, "DESKBOX_POOL_SIZE": str(args.pool_size)}
    with bench_api.server(tmp / "state-pool", pool_env) as http:
        progress(f"warm pool of {args.pool_size}: waiting for it to fill...")

        def refill() -> None:
            wait_pool_full(http, args.pool_size, args.pool_fill_s)

        runs = measure(http, args.runs, "warm pool", DEFAULT, refill)
        for line in pool_metrics(http):
            progress(f"after the warm runs: {line}")
        return runs


# -- the table ---------------------------------------------------------------------------


def _cells(samples: Sequence[float]) -> str:
    return (f"{statistics.median(samples) * 1000:.0f} | {bench_api.p95(samples) * 1000:.0f}")


def _row(label: str, runs: Runs, ratio: str = "–") -> str:
    return (f"| {label} | {len(runs.painted)} | {_cells(runs.created)} | {_cells(runs.painted)}"
            f" | {ratio} |")


def render(args: argparse.Namespace, cold: Runs, cold_default: Runs, warm: Runs | str,
           ) -> list[str]:
    lines = [
        f"## Session start-up, {args.backend} backend, {bench_api.WIDTH}x{bench_api.HEIGHT}"
        " (times in ms)\n",
        "| start | n | POST returned p50 | p95 | start page painted p50 | p95 "
        "| cold/warm (painted p50) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row("cold, start page (data: URL; a fresh desktop per create)", cold),
        _row("cold, default create (about:blank; a fresh desktop per create)", cold_default),
    ]
    pool = f"warm pool, default create (DESKBOX_POOL_SIZE={args.pool_size})"
    if isinstance(warm, str):
        lines.append(f"| {pool} | 0 | – | – | – | – | {warm} |")
    else:
        ratio = statistics.median(cold_default.painted) / statistics.median(warm.painted)
        lines.append(_row(pool, warm, f"{ratio:.1f}×"))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", choices=("container", "local"), default="container")
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--pool-fill-s", type=float, default=10.0,
                        help="wait for the pool to refill when /metrics has no pool gauge")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.pool_size < 1:
        parser.error("--runs and --pool-size must be at least 1")
    if args.backend == "container" and os.geteuid() != 0:
        raise SystemExit("the container backend needs root (runc sandboxes)")
    bench_api.interrupt_on_sigterm()
    env = {"DESKBOX_BACKENDS": args.backend, "DESKBOX_DEFAULT_BACKEND": args.backend}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-startup-") as tmp:
        with bench_api.server(Path(tmp) / "state", env) as http:
            progress(f"cold starts on the {args.backend} backend...")
            cold = measure(http, args.runs, "cold", START_PAGE)
            cold_default = measure(http, args.runs, "cold", DEFAULT)
        warm = measure_pool(args, env, Path(tmp))
        if isinstance(warm, str):
            progress(warm)
    print("\n".join(render(args, cold, cold_default, warm)))
    print()
    print(f"- Command: `.venv/bin/python bench/startup.py --runs {args.runs} --backend"
          f" {args.backend} --pool-size {args.pool_size}`; one create at a time, each session"
          " deleted before the next; painted = the start page's colour (about:blank: white) in a"
          " 320x200 screenshot, polled back to back; cold/warm compares the default creates.")
    print(f"- {os.cpu_count()} CPUs; 1-minute load average {load_before:.2f} before,"
          f" {os.getloadavg()[0]:.2f} after (other work on the host skews the figures).")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("[startup] interrupted; "
              "every session was deleted and every server stopped", file=sys.stderr)
        sys.exit(130)
