"""The live view on the container backend: what a human's browser and a VNC client see.

Run from the repository root (root, runc, Debian's novnc and chromium)::

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

x11vnc is the VNC server measured here; ARCHITECTURE.md has TigerVNC Xvnc's figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import api as bench_api  # noqa: E402  (bench/api.py: the server helper)

from deskbox_server.driver.browser import CdpPage  # noqa: E402
from tests.headless import headless_chromium  # noqa: E402
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
    for pid in bench_api.container_pids(session_id):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "x11vnc":
                return pid
        except OSError:
            continue
    raise SystemExit("no x11vnc in the session")


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
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
