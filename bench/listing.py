"""A key that ran many sessions: listing them, and what a listing costs everyone else.

Run from the repository root (root; the local engine, no sandbox)::

    .venv/bin/python bench/listing.py [--ended 50000] [--clicks 400]

The registry is seeded with ``--ended`` stopped and failed sessions of the bench's key (six
days of an RL team's episodes). Two ``deskbox serve`` answer on copies of it, each with one
live session: ours, and the baseline, the same server with its ``gc.freeze()`` made a no-op
(what start-up made then stays in every full collection of the cyclic GC). In turns, four
rounds each, it measures ``GET /v1/sessions`` (the first page of 100, a page of 1,000, a
walk of every page) and the websocket click of the live session, alone and while another
process walks the pages of 1,000 again and again: a listing must not stall the other
sessions' actions.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from api import CLICK, KEY, create, interrupt_on_sigterm, p95, server, ws_call  # bench/api.py
from websockets.sync.client import ClientConnection, connect

from deskbox_server.api.auth import key_id
from deskbox_server.schemas.sessions import Failure, SessionCreate, SessionState
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.registry import Registry

# The server, with the GC's freeze of what start-up made turned off (the baseline).
NO_FREEZE = [sys.executable, "-c",
             "import gc, sys; gc.freeze = lambda: None; sys.argv[0] = 'deskbox'; "
             "from deskbox.cli import main; main()"]
ROUNDS = 4  # the two servers take turns, so that the host's moods touch both alike
PAGER = """
import sys, httpx
http = httpx.Client(base_url=sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
cursor = None
while True:
    query = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
    cursor = http.get("/v1/sessions", params=query).raise_for_status().json()["next_cursor"]
"""


def seed(state_dir: Path, ended: int) -> None:
    # Six days: within the week the server keeps ended sessions (ENDED_SESSION_TTL_H).
    start = datetime.now(UTC) - timedelta(days=6)
    owner = key_id(KEY)

    async def write() -> None:
        registry = Registry(state_dir / "sessions.sqlite3")
        await registry.open()
        for n in range(ended):
            failed = n % 20 == 0
            created = start + timedelta(seconds=n * 6 * 86400 / ended)
            ended_at = created + timedelta(minutes=5)
            await registry.save(SessionRecord(
                id=f"ses_bench{n:07d}", owner=owner, backend="local",
                body=SessionCreate(labels={"episode": str(n)}), timeout_s=900,
                state=SessionState.failed if failed else SessionState.stopped,
                created_at=created, ended_at=ended_at,
                failure=Failure(reason="the episode's desktop died", at=ended_at)
                if failed else None,
            ))
        await registry.close()

    state_dir.mkdir(parents=True)
    asyncio.run(write())


def timed_ms(fn: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def walk(http: httpx.Client) -> int:
    cursor, count = None, 0
    while True:
        params: dict[str, object] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
        body = http.get("/v1/sessions", params=params).raise_for_status().json()  # type: ignore[arg-type]
        count += len(body["sessions"])
        if (cursor := body["next_cursor"]) is None:
            return count


@dataclass
class Side:
    """One server of the comparison, its live session's websocket, and its figures."""

    http: httpx.Client
    ws: ClientConnection
    results: dict[str, list[float]] = field(default_factory=dict)
    counter: list[int] = field(default_factory=lambda: [0])

    def add(self, name: str, samples: list[float]) -> None:
        self.results.setdefault(name, []).extend(samples)

    def click(self) -> None:
        ws_call(self.ws, self.counter, CLICK)


def start(stack: ExitStack, state_dir: Path, program: Sequence[str] | None) -> Side:
    env = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}
    http = stack.enter_context(
        server(state_dir, env, log=state_dir.parent / "server.log", program=program))
    session = create(http)
    stack.callback(lambda: http.delete(f"/v1/sessions/{session}"))
    url = f"ws://127.0.0.1:{http.base_url.port}/v1/sessions/{session}/actions/ws"
    ws = stack.enter_context(connect(
        url, additional_headers={"Authorization": f"Bearer {KEY}"}, compression=None))
    side = Side(http, ws)
    for _ in range(20):
        side.click()
    return side


def measure(side: Side, ended: int, clicks: int) -> None:
    """One round of every measure on one server (the rounds alternate between them)."""
    http = side.http
    side.add("first page (100)", timed_ms(lambda: http.get("/v1/sessions").raise_for_status(), 10))
    side.add("a page of 1,000", timed_ms(
        lambda: http.get("/v1/sessions", params={"limit": 1000}).raise_for_status(), 3))
    started = time.perf_counter()
    listed = walk(http)
    side.add("every page of 1,000, walked", [(time.perf_counter() - started) * 1000])
    assert listed > ended, f"the pages held {listed} sessions, not {ended} and the live one"
    side.add("websocket click, alone", timed_ms(side.click, clicks))
    pager = subprocess.Popen([sys.executable, "-c", PAGER, str(http.base_url), KEY])
    try:
        time.sleep(0.5)
        side.add("websocket click, while another client lists", timed_ms(side.click, clicks))
    finally:
        pager.kill()
        pager.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ended", type=int, default=50_000)
    parser.add_argument("--clicks", type=int, default=400, help="per server and measure")
    args = parser.parse_args()
    interrupt_on_sigterm()
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="deskbox-bench-listing-")))
        print(f"seeding {args.ended} ended sessions...", file=sys.stderr)
        seed(scratch / "ours" / "state", args.ended)
        shutil.copytree(scratch / "ours", scratch / "baseline")  # a state dir has one server
        ours = start(stack, scratch / "ours" / "state", None)
        baseline = start(stack, scratch / "baseline" / "state", NO_FREEZE)
        for round_ in range(ROUNDS):
            for side in (ours, baseline) if round_ % 2 == 0 else (baseline, ours):
                measure(side, args.ended, args.clicks // ROUNDS)
    print(f"{args.ended} ended sessions of one key; ms")
    print()
    print("| measure | p50 | p95 | max | baseline (no gc.freeze) p50 / p95 / max | p95 ratio |")
    print("|---|---|---|---|---|---|")
    for name, samples in ours.results.items():
        base = baseline.results[name]
        print(f"| {name} | {statistics.median(samples):.1f} | {p95(samples):.1f} "
              f"| {max(samples):.1f} | {statistics.median(base):.1f} / {p95(base):.1f} / "
              f"{max(base):.1f} | {p95(samples) / p95(base):.2f} |")


if __name__ == "__main__":
    main()
