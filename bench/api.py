"""The server end to end on the container backend: what an agent sees over HTTP.

Run from the repository root (root, runc; builds the session image first if missing)::

    .venv/bin/python bench/api.py [--creates 5] [--iterations 200]

It starts ``deskbox serve`` as a subprocess on a free loopback port with a temporary state
dir (the image cache is ``DESKBOX_IMAGE_STATE_DIR``, default ``.state/``) and measures:

- create → first screenshot showing the start page painted: ``POST /v1/sessions`` with a
  ``data:`` page of one known colour, then screenshots until that colour shows;
- screenshot (JPEG q75, 1280x800) and click round trips, through REST (one keep-alive
  connection) and the actions websocket (one connection, one request in flight);
- memory per idle session: PSS (``/proc/PID/smaps_rollup``) summed over the processes in the
  session's cgroup, for one session alone and per session with three running.

Prints a markdown table with the issue's targets. Every session is deleted and the server
stopped on exit.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from PIL import Image
from websockets.sync.client import ClientConnection, connect

REPO = Path(__file__).resolve().parents[1]
KEY = "bench-key-0123456789abcdef"
WIDTH, HEIGHT = 1280, 800
COLOUR = (0x3A, 0x7B, 0xD5)
PAINTED_PAGE = (
    "data:text/html,<!doctype html><title>bench</title>"
    "<body style='margin:0;background:%233a7bd5'></body>"
)
CLICK = {"type": "click", "x": 640, "y": 500}
SHOT = {"type": "screenshot", "format": "jpeg", "quality": 75}
# A look asked exactly like the last one, at a screen that has not changed since, is the
# last one's bytes: the agent reuses them (a round trip instead of a capture and an encode).
# So a screenshot's figure asks for quality 75 and 74 in turn (PNG ignores it), and every
# look is captured and encoded, as after a change; `reused` rows time the reuse itself.
FRESH_QUALITIES = (75, 74)
TARGETS_MS = {"create": 1000.0, "ws_screenshot": 5.0, "click": 2.0}


def p95(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def interrupt_on_sigterm() -> None:
    """SIGTERM (make, a CI timeout) unwinds like Ctrl-C, so every session is deleted."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def server(
    state_dir: Path, extra_env: Mapping[str, str] | None = None, log: Path | None = None,
    program: Sequence[str] | None = None,
) -> Iterator[httpx.Client]:
    """``deskbox serve`` on a free loopback port; ``extra_env`` adds ``DESKBOX_*`` settings;
    ``log``: where its log (stderr) goes instead of this terminal; ``program``: what runs in
    place of ``deskbox`` (its ``serve`` arguments follow)."""
    port = free_port()
    env = {
        **os.environ,
        "DESKBOX_API_KEYS": KEY,
        **(extra_env or {}),
    }
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir.parent / "server.out", "wb") as output, \
            open(log if log is not None else os.devnull, "ab") as errors:
        process = subprocess.Popen(
            [*(program or [str(Path(sys.executable).parent / "deskbox")]), "serve",
             "--host", "127.0.0.1",
             "--port", str(port), "--state-dir", str(state_dir)],
            env=env, stdin=subprocess.DEVNULL, stdout=output,
            stderr=errors if log is not None else None,
        )
    try:
        # The image build (first run only) reports its progress on the server's stderr.
        print("starting the server (builds the session image if missing)...", file=sys.stderr)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                          headers={"Authorization": f"Bearer {KEY}"}) as http:
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"the server exited with {process.returncode}")
                try:
                    if http.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            yield http
    finally:
        process.send_signal(signal.SIGTERM)  # stops every session it still runs
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def status_field(pid: int, name: str) -> int:
    """A number of ``/proc/<pid>/status`` (``VmRSS`` in KiB, ``Threads``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise SystemExit(f"no {name} in /proc/{pid}/status")


def server_pid(http: httpx.Client) -> int:
    """The pid of the ``deskbox serve`` process that :func:`server` started for ``http``."""
    port = str(http.base_url.port).encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        if b"serve" in argv and b"--port" in argv and argv[argv.index(b"--port") + 1] == port:
            return int(cmdline.parent.name)
    raise SystemExit(f"no deskbox server process on port {port.decode()}")


def create(http: httpx.Client, start_url: str = "about:blank") -> str:
    response = http.post("/v1/sessions", json={
        "display": {"width": WIDTH, "height": HEIGHT}, "browser": {"start_url": start_url},
    })
    response.raise_for_status()
    session_id: str = response.json()["id"]
    return session_id


def shows_colour(data: bytes) -> bool:
    image = Image.open(io.BytesIO(data)).convert("RGB")
    pixel = image.getpixel((image.width // 2, image.height * 3 // 4))
    assert isinstance(pixel, tuple)
    return all(abs(int(p) - c) <= 12 for p, c in zip(pixel, COLOUR, strict=True))


def wait_painted(http: httpx.Client, session_id: str, started: float) -> float:
    """Screenshots until PAINTED_PAGE shows; the seconds since ``started`` (perf_counter)."""
    while True:
        shot = http.get(f"/v1/sessions/{session_id}/screenshot",
                        params={"format": "jpeg", "quality": 50, "scale": "320x200"})
        shot.raise_for_status()
        if shows_colour(shot.content):
            return time.perf_counter() - started
        if time.perf_counter() - started > 30:
            raise SystemExit("the start page was not painted within 30 s")


def create_to_painted(http: httpx.Client, runs: int) -> tuple[list[float], list[float]]:
    """Seconds from POST /v1/sessions to its return, and to a screenshot of the page."""
    created, painted = [], []
    for _ in range(runs):
        started = time.perf_counter()
        session_id = create(http, PAINTED_PAGE)
        created.append(time.perf_counter() - started)
        try:
            painted.append(wait_painted(http, session_id, started))
        finally:
            http.delete(f"/v1/sessions/{session_id}")
    return created, painted


def timed(fn: Callable[[], object], iterations: int, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return samples


def fresh_looks(request: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    """``request`` with quality 75 and 74 in turn: each look is a capture and an encode."""
    turns = itertools.cycle(FRESH_QUALITIES)
    return lambda: {**request, "quality": next(turns)}


def each_time(request: Mapping[str, Any]) -> Callable[[], dict[str, Any]]:
    """``request`` for every call of a timed loop; a screenshot's as ``fresh_looks`` asks."""
    if request.get("type") == "screenshot":
        return fresh_looks(request)
    return lambda: dict(request)


def ws_call(ws: ClientConnection, counter: list[int], action: dict[str, Any]) -> None:
    counter[0] += 1
    ws.send(json.dumps({"id": counter[0], "action": action}))
    reply = json.loads(ws.recv(timeout=20))
    assert reply["ok"], reply
    for _ in range(reply.get("binary_frames", 0)):
        ws.recv(timeout=20)


def round_trips(http: httpx.Client, session_id: str, iterations: int) -> dict[str, list[float]]:
    base = f"/v1/sessions/{session_id}"
    results: dict[str, list[float]] = {}

    rest_params = fresh_looks({"format": "jpeg"})

    def rest_shot() -> None:
        http.get(f"{base}/screenshot", params=rest_params()).raise_for_status()

    def rest_click() -> None:
        http.post(f"{base}/actions", json=CLICK).raise_for_status()

    results["REST screenshot"] = timed(rest_shot, iterations)
    results["REST click"] = timed(rest_click, iterations)
    url = f"ws{str(http.base_url).removeprefix('http').rstrip('/')}{base}/actions/ws"
    with connect(url, additional_headers={"Authorization": f"Bearer {KEY}"},
                 compression=None, max_size=None) as ws:
        counter = [0]
        shot = fresh_looks(SHOT)
        results["websocket screenshot"] = timed(lambda: ws_call(ws, counter, shot()), iterations)
        results["websocket screenshot, reused"] = timed(
            lambda: ws_call(ws, counter, SHOT), iterations)
        results["websocket click"] = timed(lambda: ws_call(ws, counter, CLICK), iterations)
    return results


def container_pids(session_id: str) -> list[int]:
    for procs in Path("/sys/fs/cgroup").glob(f"*/deskbox-*-{session_id}/cgroup.procs"):
        pids = [int(pid) for pid in procs.read_text().split()]
        if pids:
            return pids
    raise SystemExit(f"no cgroup with processes for {session_id}")


def pss_mib(session_id: str) -> float:
    return pss_of(container_pids(session_id))


def pss_of(pids: Iterable[int]) -> float:
    """PSS of these processes in MiB, from ``/proc/PID/smaps_rollup``."""
    total_kib = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # exited meanwhile
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def rest_round_trips(http: httpx.Client, session_id: str, iterations: int
                     ) -> dict[str, list[float]]:
    """REST screenshot (JPEG q75/74 in turn) and click round trips of one session, in ms."""
    base = f"/v1/sessions/{session_id}"
    params = fresh_looks({"format": "jpeg"})
    return {
        "REST screenshot (ms)": [1000 * s for s in timed(
            lambda: http.get(f"{base}/screenshot", params=params()).raise_for_status(),
            iterations)],
        "REST click (ms)": [1000 * s for s in timed(
            lambda: http.post(f"{base}/actions", json=CLICK).raise_for_status(), iterations)],
    }


def print_side_by_side(results: Mapping[str, Mapping[str, Sequence[float]]],
                       labels: Mapping[str, str]) -> None:
    """A markdown table of backends' figures (``labels``: backend → column title, in order)
    and each later one's ratio to the first (the baseline, measured in the same run)."""
    (first, _), *others = labels.items()
    ratios = [f"{other} / {first}" for other, _ in others]
    print("| figure | " + " | ".join([*labels.values(), *ratios]) + " |")
    print("|---" * (1 + len(labels) + len(ratios)) + "|")
    for name, first_samples in results[first].items():
        cells = [cell(results[backend][name]) for backend in labels]
        base = max(statistics.median(first_samples), 1e-9)
        cells += [f"{statistics.median(results[other][name]) / base:.1f}×"
                  for other, _ in others]
        print(f"| {name} | " + " | ".join(cells) + " |")


def cell(samples: Sequence[float]) -> str:
    if len(samples) == 1:
        return f"{samples[0]:.2f}"
    return f"{statistics.median(samples):.2f} (p95 {p95(samples):.2f})"


def verdict(value_ms: float, target_ms: float) -> str:
    return "PASS" if value_ms <= target_ms else "MISS"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--idle-s", type=float, default=5.0, help="settle before PSS")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("bench/api.py needs root (runc sandboxes)")
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-api-") as tmp, \
            server(Path(tmp) / "state") as http:
        created, painted = create_to_painted(http, args.creates)
        first = create(http, PAINTED_PAGE)
        trips = round_trips(http, first, args.iterations)
        time.sleep(args.idle_s)
        alone = pss_mib(first)
        others = [create(http) for _ in range(2)]
        time.sleep(args.idle_s)
        shared = [pss_mib(session_id) for session_id in (first, *others)]
        for session_id in (first, *others):
            http.delete(f"/v1/sessions/{session_id}")

    def ms(samples: Sequence[float]) -> tuple[float, float]:
        return statistics.median(samples) * 1000, p95(samples) * 1000

    rows: list[tuple[str, str, str, str, str]] = []
    median, high = ms(created)
    rows.append(("create (POST returns, toolbar drawn)", f"{median:.0f}", f"{high:.0f}",
                 str(len(created)), ""))
    median, high = ms(painted)
    rows.append(("create → screenshot shows the start page", f"{median:.0f}", f"{high:.0f}",
                 str(len(painted)), f"≤ 1000: {verdict(median, TARGETS_MS['create'])}"))
    for name, samples in trips.items():
        median, high = ms(samples)
        target = ""
        if name == "websocket screenshot":
            target = f"≤ 5: {verdict(median, TARGETS_MS['ws_screenshot'])}"
        elif name.endswith("click"):
            target = f"≤ 2: {verdict(median, TARGETS_MS['click'])}"
        rows.append((f"{name} ({WIDTH}x{HEIGHT})", f"{median:.1f}", f"{high:.1f}",
                     str(len(samples)), target))

    print(f"## Server on the container backend, {WIDTH}x{HEIGHT} (times in ms)\n")
    print("| measure | median | p95 | n | target (p50) |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("| memory per idle session (PSS of the sandbox's processes) | MiB |")
    print("|---|---:|")
    print(f"| one session alone | {alone:.0f} |")
    print(f"| each of three sessions (mean; shared pages split) | {statistics.mean(shared):.0f} |")
    print()
    print(f"- {os.cpu_count()} CPUs; server and client are separate processes on loopback; "
          "JPEG quality 75; one request in flight.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
