"""The live view on the container backend: what a human's browser and a VNC client see.

Run from the repository root (root, runc and chromium)::

    .venv/bin/python bench/vnc.py [--runs 5] [--frames 20] [--seconds 5]

It starts ``deskbox serve`` (bench/api.py's helper), one session showing a page of one
known colour, and measures:

- view link → first desktop pixels: a headless Chromium (host, loopback) opens
  ``/v1/sessions/{id}/view?token=`` and polls noVNC's canvas until the page's colour shows.
  Every run starts x11vnc afresh (the previous viewer left, so it was stopped);
- full-frame update: a non-incremental FramebufferUpdateRequest for the whole 1280x800
  screen, answered in raw 32-bit pixels (4 MB) through the websocket proxy;
- viewer CPU cost on an animated page (a box moving every frame): CPU time of x11vnc (in
  the sandbox) and of the server process (the proxy), per second, with 1 and 2 viewers
  that keep asking for updates.

Then, in the same run, x11vnc against TigerVNC's Xvnc (Debian's
``tigervnc-standalone-server``, from scripts/setup.sh) side by side, on the host, each with a
Chromium window (``--kiosk``, no window manager) showing the same pages, driven only through
RFB on a unix socket (the same client, tests/rfb_client.py; no proxy, and nothing in this
process talks X, so python-xlib's Xvfb-then-Xvnc crash cannot happen):

- x11vnc: Xvfb plus x11vnc with the server's own flags (agent/vnc_server.py), started
  afresh for every run as the server does for a first viewer;
- Xvnc: ``Xvnc -rfbunixpath SOCKET -rfbport -1 -SecurityTypes None`` (no TCP port), the X
  server and the VNC server in one process, serving from the start;

and prints the median, p95 and x11vnc/Xvnc ratio of: (server start +) connect → first full
frame; full-frame update (raw 32-bit, 1280x800); updates per second on the animated page with
one viewer; CPU of the VNC server process and of X server + VNC server, per 1-s interval.
``--compare-only`` runs just this part (it needs no runc, image or API server).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import api as bench_api  # noqa: E402  (bench/api.py: the server helper)

from deskbox_server.agent.vnc_server import x11vnc_argv  # noqa: E402
from tests.cdp_page import CdpPage  # noqa: E402
from tests.headless import CHROMIUM, headless_chromium  # noqa: E402
from tests.rfb_client import RfbViewer  # noqa: E402

COLOUR = bench_api.COLOUR
ANIMATED_PAGE = (
    "data:text/html,<!doctype html><body style='margin:0;background:%23fff'>"
    "<div id=b style='position:absolute;width:300px;height:300px;background:%23c33'></div>"
    "<script>let t=0;(function f(){t++;b.style.left=(t*7%25900)+'px';"
    "b.style.top=(t*3%25400)+'px';requestAnimationFrame(f)})()</script></body>"
)
_PIXEL = """(() => {
  const v = window.__deskbox, c = document.querySelector('#screen canvas');
  if (!v || !v.connected || !c || c.width < 640) return null;
  const d = c.getContext('2d').getImageData(640, 400, 1, 1).data;
  return [d[0], d[1], d[2]];
})()"""


def token(http: object, session_id: str, scope: str) -> str:
    response = http.post(f"/v1/sessions/{session_id}/tokens", json={"scope": scope})  # type: ignore[attr-defined]
    response.raise_for_status()
    value: str = response.json()["token"]
    return value


def first_pixels(http: object, base: str, session_id: str, runs: int) -> list[float]:
    samples = []
    with tempfile.TemporaryDirectory() as profile, headless_chromium(Path(profile)) as devtools, \
            CdpPage.first(devtools) as cdp:
        for _ in range(runs):
            link = f"{base}/v1/sessions/{session_id}/view?token={token(http, session_id, 'view')}"
            started = time.perf_counter()
            cdp.navigate(link)
            while cdp.evaluate(_PIXEL) != list(COLOUR):
                if time.perf_counter() - started > 30:
                    raise SystemExit("the view never showed the page")
                time.sleep(0.005)
            samples.append(time.perf_counter() - started)
            cdp.navigate("about:blank")
            time.sleep(1.0)  # the viewer left: x11vnc stops
    return samples


def full_frames(url: str, frames: int) -> list[float]:
    with RfbViewer(url) as viewer:
        viewer.full_frame()
        samples = []
        for _ in range(frames):
            started = time.perf_counter()
            viewer.full_frame()
            samples.append(time.perf_counter() - started)
    return samples


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def x11vnc_pid(session_id: str) -> int:
    """The session's newest x11vnc: the one serving the viewers now. The one the last
    viewer left may still be exiting (SIGTERM, up to 2 s of grace)."""
    started: dict[int, int] = {}
    for pid in bench_api.container_pids(session_id):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "x11vnc":
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                started[pid] = int(fields[19])  # starttime, field 22 of proc(5)
        except OSError:
            continue
    if not started:
        raise SystemExit("no x11vnc in the session")
    return max(started, key=lambda pid: started[pid])


def viewer_cpu(url: str, session_id: str, server_pid: int, viewers: int, seconds: float,
               ) -> tuple[float, float, float]:
    """(x11vnc, server) CPU in % of one core, and updates per second per viewer."""
    stop = threading.Event()
    counts = [0] * viewers
    opened = [RfbViewer(url) for _ in range(viewers)]

    def watch(index: int, viewer: RfbViewer) -> None:
        viewer.full_frame()
        while not stop.is_set():
            viewer.request(incremental=True)
            while viewer.read_message() != 0:
                pass
            counts[index] += 1

    threads = [threading.Thread(target=watch, args=(i, v)) for i, v in enumerate(opened)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        vnc = x11vnc_pid(session_id)
        before = (cpu_seconds(vnc), cpu_seconds(server_pid), sum(counts))
        time.sleep(seconds)
        after = (cpu_seconds(vnc), cpu_seconds(server_pid), sum(counts))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        for viewer in opened:
            viewer.close()
    return (100 * (after[0] - before[0]) / seconds, 100 * (after[1] - before[1]) / seconds,
            (after[2] - before[2]) / seconds / viewers)


def ms(samples: Sequence[float]) -> str:
    return f"{statistics.median(samples) * 1000:.0f} ms (p95 {bench_api.p95(samples) * 1000:.0f})"

# -- x11vnc against Xvnc, on the host, RFB straight to a unix socket ----------------------

XVNC = "/usr/bin/Xvnc"
_X_START_TIMEOUT_S = 15.0


def _stop(process: subprocess.Popen[bytes], group: bool = False) -> None:
    """SIGTERM (Chromium then frees its X shared memory), SIGKILL after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def _x_server(argv: list[str]) -> Iterator[tuple[int, str]]:
    """An X server (Xvfb or Xvnc) on a free display number; (its pid, ":N")."""
    read, write = os.pipe()
    process = subprocess.Popen([*argv, "-displayfd", str(write)], pass_fds=(write,),
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    os.close(write)
    try:
        number = b""
        deadline = time.monotonic() + _X_START_TIMEOUT_S
        while not number.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([read], [], [], remaining)[0]:
                raise SystemExit(f"{argv[0]} did not start")
            chunk = os.read(read, 16)
            if not chunk:
                raise SystemExit(f"{argv[0]} exited ({process.wait()})")
            number += chunk
        yield process.pid, f":{int(number)}"
    finally:
        os.close(read)
        _stop(process)


@contextmanager
def _chromium_window(display: str, url: str, profile: Path) -> Iterator[None]:
    process = subprocess.Popen(
        [CHROMIUM, "--no-sandbox", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--kiosk", "--window-position=0,0", "--window-size=1280,800",
         f"--user-data-dir={profile}", url],
        # Its temporary files in a directory of ours (the bench's), not /tmp.
        env={**os.environ, "DISPLAY": display, "TMPDIR": str(profile)},
        start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        _stop(process, group=True)


@contextmanager
def _x11vnc(display: str, path: str) -> Iterator[int]:
    """x11vnc with the server's flags, once it accepts connections; its pid."""
    process = subprocess.Popen(x11vnc_argv(display, path), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + _X_START_TIMEOUT_S
        while True:
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(path)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("x11vnc did not start") from None
                    time.sleep(0.005)
        yield process.pid
    finally:
        _stop(process)


def _vnc_for(kind: str, display: str, path: str, x_pid: int) -> Callable[[], Any]:
    """A context manager factory: the VNC server serving ``path``; its pid."""

    @contextmanager
    def vnc() -> Iterator[int]:
        if kind == "Xvnc":
            yield x_pid  # the X server is the VNC server
        else:
            with _x11vnc(display, path) as pid:
                yield pid

    return vnc


def _first_frame(path: str) -> float:
    """Connect → the first whole framebuffer update."""
    started = time.perf_counter()
    with RfbViewer(f"unix:{path}") as viewer:
        viewer.full_frame()
    return time.perf_counter() - started


def _wait_for_colour(path: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with RfbViewer(f"unix:{path}") as viewer:
            pixel = viewer.full_frame()[200, 300]  # away from the cursor (centre)
        if all(abs(int(p) - c) <= 12 for p, c in zip(pixel, COLOUR, strict=True)):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the page never showed over RFB ({tuple(pixel)})")
        time.sleep(0.1)


def _animated(path: str, pids: Sequence[int], seconds: float,
              ) -> tuple[list[float], list[list[float]]]:
    """One viewer asking for updates without pause: updates and CPU % of each of ``pids``,
    per 1-s interval."""
    stop = threading.Event()
    count = [0]
    viewer = RfbViewer(f"unix:{path}")

    def watch() -> None:
        viewer.full_frame()
        while not stop.is_set():
            viewer.request(incremental=True)
            while viewer.read_message() != 0:
                pass
            count[0] += 1

    thread = threading.Thread(target=watch)
    rates: list[float] = []
    cpus: list[list[float]] = [[] for _ in pids]
    try:
        thread.start()
        time.sleep(1.0)
        before = (time.perf_counter(), count[0], [cpu_seconds(pid) for pid in pids])
        for _ in range(max(1, round(seconds))):
            time.sleep(1.0)
            after = (time.perf_counter(), count[0], [cpu_seconds(pid) for pid in pids])
            elapsed = after[0] - before[0]
            rates.append((after[1] - before[1]) / elapsed)
            for i, (start, end) in enumerate(zip(before[2], after[2], strict=True)):
                cpus[i].append(100 * (end - start) / elapsed)
            before = after
    finally:
        stop.set()
        thread.join(timeout=30)
        viewer.close()
    return rates, cpus


def compare_servers(runs: int, frames: int, seconds: float) -> dict[str, dict[str, list[float]]]:
    """x11vnc (on Xvfb) and Xvnc measured alike; per server, samples by measure (seconds,
    updates per second, CPU %)."""
    results: dict[str, dict[str, list[float]]] = {}
    for kind in ("x11vnc", "Xvnc"):
        with tempfile.TemporaryDirectory(prefix="dbx-vnc-cmp-") as tmp:
            path = f"{tmp}/vnc"
            got: dict[str, list[float]] = {"start": [], "connect": []}
            if kind == "Xvnc":
                argv = [XVNC, "-geometry", "1280x800", "-depth", "24", "-rfbunixpath", path,
                        "-rfbport", "-1", "-SecurityTypes", "None", "-AlwaysShared",
                        "-nolisten", "tcp"]
            else:
                argv = ["Xvfb", "-screen", "0", "1280x800x24", "-nolisten", "tcp"]
            with _x_server(argv) as (x_pid, display):
                vnc = _vnc_for(kind, display, path, x_pid)
                with _chromium_window(display, bench_api.PAINTED_PAGE, Path(tmp, "p1")):
                    with vnc():
                        _wait_for_colour(path)
                    for _ in range(runs):
                        started = time.perf_counter()
                        with vnc():
                            got["connect"].append(_first_frame(path))
                            got["start"].append(time.perf_counter() - started)
                        time.sleep(0.2)
                    with vnc():
                        got["frame"] = full_frames(f"unix:{path}", frames)
                with _chromium_window(display, ANIMATED_PAGE, Path(tmp, "p2")), \
                        vnc() as vnc_pid:
                    time.sleep(2.0)  # the page is up and animating
                    pids = [vnc_pid] if vnc_pid == x_pid else [vnc_pid, x_pid]
                    got["rate"], cpus = _animated(path, pids, seconds)
                    got["vnc_cpu"] = cpus[0]
                    got["all_cpu"] = [sum(each) for each in zip(*cpus, strict=True)]
            results[kind] = got
    return results


def _cell(samples: Sequence[float], scale: float, unit: str) -> str:
    digits = 1 if scale == 1000 and statistics.median(samples) < 0.01 else 0
    return (f"{statistics.median(samples) * scale:.{digits}f}{unit} "
            f"(p95 {bench_api.p95(samples) * scale:.{digits}f})")


def print_comparison(results: dict[str, dict[str, list[float]]]) -> None:
    x11, xvnc = results["x11vnc"], results["Xvnc"]
    rows: list[tuple[str, str, float, str, Callable[[list[float]], float]]] = [
        ("server start + connect → first full frame (x11vnc started per viewer; Xvnc "
         "runs all along)", "start", 1000, " ms", statistics.median),
        ("connect → first full frame", "connect", 1000, " ms", statistics.median),
        ("full-frame update, raw 32-bit 1280x800", "frame", 1000, " ms", statistics.median),
        ("animated page, 1 viewer: updates per s", "rate", 1, "", statistics.median),
        ("animated page: CPU of the VNC server process (% of a core)", "vnc_cpu", 1, " %",
         statistics.median),
        ("animated page: CPU of X server + VNC server (Xvfb + x11vnc; Xvnc)", "all_cpu", 1,
         " %", statistics.median),
    ]
    print()
    print("| x11vnc vs Xvnc (host, RFB on a unix socket, 1280x800) | x11vnc | Xvnc "
          "| x11vnc / Xvnc |")
    print("|---|---|---|---|")
    for label, key, scale, unit, middle in rows:
        low = middle(xvnc[key])
        ratio = f"{middle(x11[key]) / low:.1f}x" if low > 0 else "–"
        print(f"| {label} | {_cell(x11[key], scale, unit)} | {_cell(xvnc[key], scale, unit)} "
              f"| {ratio} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--compare-only", action="store_true",
                        help="only x11vnc against Xvnc on the host (no API server)")
    args = parser.parse_args(argv)
    if args.compare_only:
        print_comparison(compare_servers(args.runs, args.frames, args.seconds))
        return 0
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-vnc-") as tmp, \
            bench_api.server(Path(tmp) / "state") as http:
        base = str(http.base_url).rstrip("/")
        server_pid = _server_pid()
        session_id = bench_api.create(http, bench_api.PAINTED_PAGE)
        try:
            vnc_url = f"ws{base.removeprefix('http')}/v1/sessions/{session_id}/vnc?token="
            first = first_pixels(http, base, session_id, args.runs)
            frames = full_frames(vnc_url + token(http, session_id, "view"), args.frames)
        finally:
            http.delete(f"/v1/sessions/{session_id}")
        animated = bench_api.create(http, ANIMATED_PAGE)
        try:
            url = f"ws{base.removeprefix('http')}/v1/sessions/{animated}/vnc?token="
            cpu = {n: viewer_cpu(url + token(http, animated, "view"), animated, server_pid, n,
                                 args.seconds) for n in (1, 2)}
        finally:
            http.delete(f"/v1/sessions/{animated}")
    print("| live view (x11vnc in the sandbox, 1280x800) | median |")
    print("|---|---|")
    print(f"| view link → first desktop pixels (headless Chromium, noVNC) | {ms(first)} |")
    print(f"| full-frame update, raw 32-bit through the proxy | {ms(frames)} |")
    for n, (vnc, proxy, rate) in cpu.items():
        print(f"| animated page, {n} viewer(s): x11vnc CPU / proxy CPU / updates per s "
              f"per viewer | {vnc:.0f} % / {proxy:.0f} % / {rate:.0f} |")
    print_comparison(compare_servers(args.runs, args.frames, args.seconds))
    return 0


def _server_pid() -> int:
    """The ``deskbox serve`` child of this process."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and "deskbox" in text.split(")")[0]:
            return int(stat.parent.name)
    raise SystemExit("the server process was not found")


if __name__ == "__main__":
    raise SystemExit(main())
