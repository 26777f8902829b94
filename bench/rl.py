"""Resets and episodes for RL and evaluation (issue 18), on the container backend.

Run from the repository root (root, runc, CRIU; builds the session image first if
missing)::

    .venv/bin/python bench/rl.py [--resets 20] [--envs 1,4,8] [--pool 4]

One ``deskbox serve`` (caps raised to 40 sessions), the example task tasks/click-button.yaml
(a page uploaded and opened, then one click), and :class:`deskbox.gym.DeskboxEnv`:

- cold create: a new desktop to its first settled observation, no task (the baseline);
- cold reset: a new desktop, the task's setup and the first settled observation;
- restore: a create ``from_snapshot`` of the task's start state with no copy ready, to the
  first observation (CRIU restore), from the zstd archive and from the images a snapshot
  keeps unpacked once it has been given a pool; as an env's reset (the previous desktop's
  delete included) and alone;
- pooled reset, for 1, 4 and 8 envs at once, each on a thread resetting ``--resets`` times:
  a claim of a ready copy of the start state (``pool`` copies kept, at most 4 per snapshot:
  beyond that a reset is a restore), p50/p95 latency and resets per second in all;
- pooled reset with a ready copy waiting each time (a claim: the pool kept up);
- fork ×4 of a running session;
- episodes per hour: ``deskbox eval``'s runner and the scripted solver, 4 episodes at once,
  over all the example tasks twice, and over one task 24 times without and with a pool of 2
  (a pool pays off for many episodes of few tasks: each task's snapshot and copies cost a
  setup and restores first).

Prints a markdown table (median, p95, ratio to the cold create of the same run). Every
session and snapshot is deleted and the server stopped on exit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from api import KEY, REPO, cell, interrupt_on_sigterm, server  # bench/api.py
from density import host_busy_jiffies  # bench/density.py

from deskbox import Deskbox
from deskbox.gym import DeskboxEnv
from deskbox.tasks import Task, load_callable
from deskbox.tasks.runner import collect_tasks, run
from deskbox.tasks.start import StartStates

TASKS = REPO / "tasks"
TASK = TASKS / "click-button.yaml"
LOOK = [{"type": "wait", "ms": 0}]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def cold_creates(box: Deskbox, n: int) -> list[float]:
    def one() -> None:
        with box.sessions.create() as session:
            session.act(LOOK, screenshot={"format": "png"})
    return [timed(one) for _ in range(n)]


def cold_resets(box: Deskbox, task: Task, n: int) -> list[float]:
    with DeskboxEnv(client=box, task=task) as env:
        samples = [timed(env.reset) for _ in range(n)]
    return samples


def restores(box: Deskbox, task: Task, n: int, unpacked: bool
             ) -> tuple[list[float], list[float]]:
    """``from_snapshot`` with no copy ready: the restore path, from the zstd archive or
    (``unpacked``) from the images a snapshot keeps unpacked once it was given a pool.
    Timed twice: as ``env.reset()`` (which deletes the previous desktop first), and as the
    restore alone (a create ``from_snapshot`` to its first observation)."""
    states = StartStates(box, pool=0)
    try:
        with DeskboxEnv(client=box, task=task, start_states=states) as env:
            env.reset()  # sets the task up and snapshots it
            snapshot = box.snapshots.list()[0].id
            if unpacked:
                box.snapshots.set_pool(snapshot, 1)  # unpacks its images, then makes a copy
                deadline = time.monotonic() + 60
                while box.snapshots.get(snapshot).raw["pool"]["ready"] < 1:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                box.snapshots.set_pool(snapshot, 0)  # the images stay unpacked
            resets = [timed(env.reset) for _ in range(n)]
        alone = []
        for _ in range(n):
            started = time.perf_counter()
            session = box.sessions.create(from_snapshot=snapshot)
            session.act(LOOK, screenshot={"format": "png"})
            alone.append(time.perf_counter() - started)
            session.close()
        return resets, alone
    finally:
        states.close()


def pooled_resets(box: Deskbox, task: Task, envs: int, resets: int, pool: int
                  ) -> tuple[list[float], float]:
    """Each of ``envs`` threads resets its env ``resets`` times; the latencies, and resets
    per second over the whole run."""
    states = StartStates(box, pool=pool)
    samples: list[float] = []
    lock = threading.Lock()
    try:
        with DeskboxEnv(client=box, task=task, start_states=states) as first:
            first.reset()  # the start state's snapshot, before the clock starts
            snapshot = box.snapshots.list()[0].id
            deadline = time.monotonic() + 120
            while box.snapshots.get(snapshot).raw["pool"]["ready"] < pool:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)

        def worker() -> None:
            with DeskboxEnv(client=box, task=task, start_states=states) as env:
                for _ in range(resets):
                    took = timed(env.reset)
                    env.step(LOOK)  # an episode of one look
                    with lock:
                        samples.append(took)

        threads = [threading.Thread(target=worker) for _ in range(envs)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    finally:
        states.close()
    return samples, envs * resets / wall


def claims(box: Deskbox, task: Task, n: int) -> list[float]:
    """Resets with a ready copy waiting each time: what a reset costs when the pool keeps
    up (an agent's episode lasting longer than a restore)."""
    states = StartStates(box, pool=1)
    samples = []
    try:
        with DeskboxEnv(client=box, task=task, start_states=states) as env:
            env.reset()
            snapshot = box.snapshots.list()[0].id
            for _ in range(n):
                deadline = time.monotonic() + 60
                while box.snapshots.get(snapshot).raw["pool"]["ready"] < 1:
                    if time.monotonic() > deadline:
                        raise SystemExit("the pool made no copy in 60 s")
                    time.sleep(0.05)
                samples.append(timed(env.reset))
    finally:
        states.close()
    return samples


def wait_for_quiet(limit_s: float = 30.0, busy_below: float = 0.25) -> None:
    """Until the host's CPUs are at most ``busy_below`` busy over half a second: the pools
    of the figures before go on restoring and removing copies for a while after them."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        busy, total = host_busy_jiffies()
        time.sleep(0.5)
        busy_after, total_after = host_busy_jiffies()
        if busy_after - busy <= busy_below * (total_after - total):
            return


def forks(box: Deskbox, n: int) -> list[float]:
    """Forks of a desktop that has shown its first observation, on a host that has wound
    down from the figures before; a fork's copies are deleted before the next fork."""
    samples = []
    wait_for_quiet()
    with box.sessions.create() as session:
        session.act(LOOK, screenshot={"format": "png"})
        wait_for_quiet()
        for _ in range(n):
            started = time.perf_counter()
            copies = session.fork(4)
            samples.append(time.perf_counter() - started)
            for copy in copies:
                copy.close()
    return samples


def episodes_per_hour(box: Deskbox, tasks: list[Task], repeat: int, pool: int) -> float:
    solve = load_callable("solvers.py:solve", TASKS)
    started = time.perf_counter()
    episodes = run(tasks, solve, client=box, parallel=4, repeat=repeat, pool=pool)
    wall = time.perf_counter() - started
    failed = [e for e in episodes if not e.success]
    if failed:
        print(f"note: {len(failed)} of {len(episodes)} episodes not solved: "
              f"{[e.error or e.evaluation for e in failed]}", file=sys.stderr)
    return len(episodes) / wall * 3600


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resets", type=int, default=20, help="per env, and per figure")
    parser.add_argument("--envs", default="1,4,8", help="envs at once, comma-separated")
    parser.add_argument("--pool", type=int, default=4, help="ready copies (0-4)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/rl.py needs root (runc sandboxes, CRIU)")
    interrupt_on_sigterm()
    task = Task.load(TASK)
    small = max(3, args.resets // 4)  # the slow figures
    rows: list[tuple[str, list[float]]] = []
    rates: list[tuple[str, float]] = []
    caps = {"DESKBOX_MAX_SESSIONS": "40", "DESKBOX_MAX_SESSIONS_PER_KEY": "40"}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-rl-") as tmp, \
            server(Path(tmp) / "state", caps) as http, \
            Deskbox(str(http.base_url), KEY, timeout=120) as box:
        print("measuring: cold creates, cold resets, restores...", file=sys.stderr)
        rows.append(("cold create → first observation (baseline)", cold_creates(box, small)))
        rows.append(("cold reset (new desktop + setup + observation)",
                     cold_resets(box, task, small)))
        for unpacked, images in ((False, "images zstd-packed"), (True, "images kept unpacked")):
            resets, alone = restores(box, task, small, unpacked)
            rows.append((f"reset by a restore (no copy ready), {images}", resets))
            rows.append((f"restore alone: create from_snapshot → first observation, {images}",
                         alone))
        for envs in (int(n) for n in args.envs.split(",")):
            print(f"measuring: pooled resets, {envs} envs...", file=sys.stderr)
            samples, per_s = pooled_resets(box, task, envs, args.resets, args.pool)
            rows.append((f"pooled reset, {envs} env(s) at once (pool {args.pool})", samples))
            rates.append((f"resets per second, {envs} env(s)", per_s))
        print("measuring: forks...", file=sys.stderr)
        rows.append(("fork ×4", forks(box, small)))
        rows.append(("pooled reset with a copy ready (a claim)", claims(box, task, small)))
        print("measuring: episodes per hour...", file=sys.stderr)
        every = collect_tasks([TASKS])
        rates.append((f"episodes per hour, all {len(every)} tasks × 2, 4 at once",
                      episodes_per_hour(box, every, 2, 0)))
        for pool in (0, 2):
            rates.append((f"episodes per hour, one task × 24, 4 at once, pool {pool}",
                          episodes_per_hour(box, [task], 24, pool)))
    baseline = statistics.median(rows[0][1])
    print("| figure | seconds: median (p95) | ratio to cold create |")
    print("|---|---|---|")
    for name, samples in rows:
        print(f"| {name} | {cell(samples)} | {statistics.median(samples) / baseline:.2f}× |")
    for name, rate in rates:
        print(f"| {name} | {rate:.1f} | – |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
