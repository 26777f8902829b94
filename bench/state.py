"""Pause and resume: what freezing a session costs (issue 6).

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/state.py [--cycles 20]

Starts ``deskbox serve`` as bench/api.py does, creates one session with a page that animates
(so the sandbox has work to stop), and measures over ``--cycles`` freeze/thaw cycles:

- the cgroup freezer itself (``engines/runc/freezer.py``: write ``FROZEN``, read until every
  task is frozen; then ``THAWED``) on that session's sandbox;
- ``runc pause`` / ``runc resume``, which do the same through a runc process;
- ``POST /pause {"mode": "freeze"}`` and ``POST /resume`` round trips through the API
  (the pause includes draining, grabbing the last frame and saving the state);
- ``--hibernations`` cycles of ``POST /pause {"mode": "hibernate"}`` (CRIU dump + zstd) and
  ``POST /resume`` (unpack + restore + reconnect), and the checkpoint's size raw and
  compressed (needs scripts/criu.sh);
- ``--snapshots`` rounds of ``POST /snapshots`` and a create ``from_snapshot``, and
  ``--forks`` calls of ``POST /fork {"count": --fork}`` (all copies running when it answers).

Prints a markdown table with the issues' targets (freeze ≤ 10 ms, restore ≤ 0.5 s; fork ×4
≤ 1 s, issue 18's, where issue 6 asked ≤ 2 s). The session is deleted and the server
stopped on exit.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from api import create, p95, server, verdict  # bench/api.py (this script's directory)

from deskbox_server.engines.runc import freezer

TARGET_MS = 10.0
ANIMATED = "data:text/html;base64," + base64.b64encode(
    b"<body style='margin:0'><canvas id=c width=800 height=600></canvas><script>"
    b"const g=document.getElementById('c').getContext('2d');let t=0;"
    b"(function f(){g.fillStyle=`hsl(${t++%360},80%,50%)`;g.fillRect(0,0,800,600);"
    b"requestAnimationFrame(f)})()</script></body>"
).decode()


def cycles(
    freeze: Callable[[], object], thaw: Callable[[], object], count: int
) -> tuple[list[float], list[float]]:
    frozen: list[float] = []
    thawed: list[float] = []
    for _ in range(count):
        started = time.perf_counter()
        freeze()
        frozen.append((time.perf_counter() - started) * 1000)
        time.sleep(0.02)
        started = time.perf_counter()
        thaw()
        thawed.append((time.perf_counter() - started) * 1000)
        time.sleep(0.05)  # let the page run between cycles
    return frozen, thawed


def container_of(session_id: str) -> str:
    """The server names containers ``deskbox-<hash of its state dir>-<session id>``."""
    listed = subprocess.run(["runc", "list", "-q"], check=True, capture_output=True, text=True)
    found = [cid for cid in listed.stdout.split() if cid.endswith("-" + session_id)]
    assert len(found) == 1, listed.stdout
    return found[0]


def runc(*args: str) -> None:
    subprocess.run(["runc", *args], check=True, capture_output=True)


def row(name: str, samples: Sequence[float], target_ms: float = TARGET_MS) -> str:
    if not samples:  # that part was asked 0 times
        return f"| {name} | – | – | – | not measured |"
    median = statistics.median(samples)
    mark = verdict(median, target_ms) + f" (≤ {target_ms:g})" if target_ms else "-"
    return (f"| {name} | {median:.2f} | {p95(samples):.2f} | {max(samples):.2f} "
            f"| {mark} |")


def tar_bytes(archive: Path) -> int:
    """The size of the images inside a zstd tar (their sum)."""
    listed = subprocess.run(["tar", "-I", "zstd -q", "-tvf", str(archive)], check=True,
                            capture_output=True, text=True)
    return sum(int(line.split()[2]) for line in listed.stdout.splitlines() if line)


def timed(call: Callable[[], httpx.Response], status: int) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    response = call()
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == status, response.text
    return elapsed, response


def snapshot_and_fork(
    http: httpx.Client, session_id: str, args: argparse.Namespace
) -> tuple[list[float], list[float], list[float]]:
    """Snapshot the session and make a copy of it, ``--snapshots`` times; then fork it
    ``--fork`` ways, ``--forks`` times. Every copy is deleted before the next round."""
    snapshots: list[float] = []
    restores: list[float] = []
    forks: list[float] = []
    for _ in range(args.snapshots):
        elapsed, taken = timed(lambda: http.post(f"/v1/sessions/{session_id}/snapshots"), 201)
        snapshots.append(elapsed)
        snap_id = taken.json()["id"]
        elapsed, copy = timed(
            lambda: http.post("/v1/sessions", json={"from_snapshot": snap_id}), 201)  # noqa: B023
        restores.append(elapsed)
        http.delete(f"/v1/sessions/{copy.json()['id']}")
        http.delete(f"/v1/snapshots/{snap_id}")
    for _ in range(args.forks):
        elapsed, made = timed(lambda: http.post(f"/v1/sessions/{session_id}/fork",
                                                json={"count": args.fork}), 201)
        forks.append(elapsed)
        for copy in made.json()["sessions"]:
            http.delete(f"/v1/sessions/{copy['id']}")
    return snapshots, restores, forks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--hibernations", type=int, default=3)
    parser.add_argument("--snapshots", type=int, default=3)
    parser.add_argument("--fork", type=int, default=4, help="copies per fork")
    parser.add_argument("--forks", type=int, default=2, help="fork calls")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-state-") as tmp, \
            server(Path(tmp) / "state") as http:
        session_id = create(http, ANIMATED)
        try:
            container_id = container_of(session_id)
            direct = cycles(lambda: freezer.freeze(container_id),
                            lambda: freezer.thaw(container_id), args.cycles)
            via_runc = cycles(lambda: runc("pause", container_id),
                              lambda: runc("resume", container_id), args.cycles)

            def pause() -> None:
                response = http.post(f"/v1/sessions/{session_id}/pause", json={"mode": "freeze"})
                assert response.json()["state"] == "paused", response.text

            def resume() -> None:
                response = http.post(f"/v1/sessions/{session_id}/resume")
                assert response.json()["state"] == "running", response.text

            api = cycles(pause, resume, args.cycles)
            archive = Path(tmp) / "state" / "sessions" / session_id / "hibernate" / "images.tar.zst"
            sizes: list[tuple[int, int]] = []

            def hibernate() -> None:
                response = http.post(f"/v1/sessions/{session_id}/pause",
                                     json={"mode": "hibernate"})
                assert response.json()["state"] == "hibernated", response.text
                sizes.append((tar_bytes(archive), archive.stat().st_size))

            hibernated = cycles(hibernate, resume, args.hibernations)
            frozen_shot = http.get(f"/v1/sessions/{session_id}/screenshot")  # sanity
            assert "x-deskbox-frozen" not in frozen_shot.headers
            snapshots, restores, forks = snapshot_and_fork(http, session_id, args)
        finally:
            http.delete(f"/v1/sessions/{session_id}")
    print(f"\n{args.cycles} freeze/thaw cycles of one session animating a canvas (ms)\n")
    print("| what | median | p95 | max | target (ms) |")
    print("|---|---|---|---|---|")
    print(row("freezer.state FROZEN (direct)", direct[0]))
    print(row("freezer.state THAWED (direct)", direct[1]))
    print(row("runc pause", via_runc[0]))
    print(row("runc resume", via_runc[1]))
    print(row("POST /pause freeze (API)", api[0]))
    print(row("POST /resume (API)", api[1]))
    print(row("POST /pause hibernate (API)", hibernated[0], 0))
    print(row("POST /resume from hibernate (API)", hibernated[1], 500.0))
    print(row("POST /snapshots (API, session runs on)", snapshots, 0))
    print(row("create from_snapshot (API, to running)", restores, 500.0))
    print(row(f"POST /fork count={args.fork} (API, all running)", forks, 1000.0))
    if sizes:
        raw, packed = sizes[-1]
        print(f"\ncheckpoint of that session: {raw / 2**20:.0f} MiB raw, "
              f"{packed / 2**20:.1f} MiB with zstd -1")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
