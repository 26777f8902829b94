"""Peers on one desktop: our server against cua-computer-server and xdotool + scrot.

Run from the repository root (no root needed; the first run installs the peer)::

    .venv/bin/python bench/peers.py [--iterations 100] [--peer-python PATH] [--no-cua]

It starts ``deskbox serve`` with the ``local`` backend on a free loopback port, creates one
1280x800 session showing a page that counts clicks (the backend runs Xvfb, openbox, Chromium
and the desktop's agent, ``python -m deskbox_agent``, which the server drives over its unix
socket), and drives that one desktop (same Xvfb, same page) four ways, one request in
flight each:

- ours, websocket: ``/v1/sessions/{id}/actions/ws`` (one connection);
- ours, REST: ``GET /screenshot`` and ``POST /actions`` (one keep-alive connection);
- cua-computer-server (PyPI, pinned in bench/peers-requirements.txt) in its own venv
  (bench/.peers/venv, made here with a Python >= 3.12), run with ``DISPLAY`` set to the
  session's display on 127.0.0.1 only, with telemetry off and no cloud settings, driven
  through its own websocket (``/ws``: ``{"command": "screenshot" | "left_click", "params"}``);
- the xdotool + scrot method of E2B Desktop and Anthropic's demo: one process per action.

Operations: a JPEG and a PNG screenshot, a click, and an agent's step (a click, then a JPEG
look at its effect: two calls in turn). Prints a markdown table of p50, p95 and peer/ours
(our websocket) ratios per operation, what each call guarantees when it returns, and how
many clicks the page registered. If the cua peer cannot be installed or run, its rows say
why and the rest is still measured. Every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ (its CdpPage)

import api as bench_api  # noqa: E402 (bench/api.py, this script's directory: the server helper)
import cua_peer  # noqa: E402 (bench/cua_peer.py: the peer's venv and server)
import httpx  # noqa: E402
from websockets.sync.client import ClientConnection, connect  # noqa: E402

from tests.cdp_page import CdpPage  # noqa: E402
from tests.processes import descendants  # noqa: E402

WIDTH, HEIGHT = 1280, 800
# Inside the page, below Chromium's toolbar.
CLICK_X, CLICK_Y = 640, 400
JPEG_QUALITY = 75
WARMUP = 3
# The methods take turns in this many blocks (see measure()).
ROUNDS = 5
# Clicks still in flight when a batch's last call returned get this long to reach the page.
LAND_S = 0.5
PAGE = (
    "data:text/html,<!doctype html><title>peers</title>"
    "<body style='margin:0;height:100vh;background:%23dde7f0'>"
    "<script>window.clicks=0;addEventListener('click',()=>{clicks+=1})</script></body>"
)
# The last is an agent's step: the action, then a look at its effect (two calls in turn).
OPERATIONS = ("screenshot JPEG q75", "screenshot PNG", "click", "click, then a JPEG look")
CLICKING = frozenset(OPERATIONS[2:])  # the page counts these operations' clicks


def progress(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


@dataclass
class Method:
    """One way to drive the desktop: a callable per operation, and what its return means."""

    name: str
    calls: dict[str, Callable[[], int]]  # operation -> call returning the image size (or 0)
    guarantees: dict[str, str]


@dataclass
class Result:
    samples: list[float] = field(default_factory=list)
    size: int = 0
    registered: str = ""
    error: str = ""


# -- the session's desktop, found from the server's process tree --------------------------


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def x_display(xvfb_pid: int) -> str:
    """The display an Xvfb listens on: its socket inodes matched in /proc/net/unix."""
    inodes = set()
    for fd in Path(f"/proc/{xvfb_pid}/fd").iterdir():
        with suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes:
            match = re.search(r"/tmp/\.X11-unix/X(\d+)$", fields[7])
            if match:
                return f":{match.group(1)}"
    raise SystemExit(f"Xvfb {xvfb_pid} listens on no X socket")


@dataclass(frozen=True)
class SessionDesktop:
    display: str
    devtools_url: str


def find_desktop(pid: int) -> SessionDesktop:
    """The local session's X display and Chromium DevTools endpoint (one session running)."""
    display = devtools = None
    for child in descendants(pid):
        argv = _argv(child)
        if not argv:
            continue
        if Path(argv[0]).name == "Xvfb":
            display = x_display(child)
        profiles = [a.split("=", 1)[1] for a in argv if a.startswith("--user-data-dir=")]
        if profiles and not any(a.startswith("--type=") for a in argv):
            port_file = Path(profiles[0]) / "DevToolsActivePort"
            with suppress(OSError):
                devtools = f"http://127.0.0.1:{port_file.read_text().split()[0]}"
    if display is None or devtools is None:
        raise SystemExit("could not find the session's Xvfb and Chromium")
    return SessionDesktop(display, devtools)


def wait_page(page: CdpPage) -> None:
    deadline = time.monotonic() + 30
    while page.evaluate("typeof window.clicks") != "number":
        if time.monotonic() > deadline:
            raise SystemExit("the click-counting page did not load")
        time.sleep(0.05)


# -- our server -------------------------------------------------------------------------


def ours_ws(ws: ClientConnection) -> Method:
    counter = [0]

    def call(action: dict[str, object]) -> int:
        counter[0] += 1
        ws.send(json.dumps({"id": counter[0], "action": action}))
        reply = json.loads(ws.recv(timeout=20))
        if not reply["ok"]:
            raise RuntimeError(str(reply))
        size = 0
        for _ in range(reply.get("binary_frames", 0)):
            size += len(ws.recv(timeout=20))
        return size

    # Each look captured and encoded: quality 75 and 74 in turn (bench/api.py fresh_looks).
    jpeg = bench_api.fresh_looks({"type": "screenshot", "format": "jpeg"})
    png = bench_api.fresh_looks({"type": "screenshot", "format": "png"})
    click = {"type": "click", "x": CLICK_X, "y": CLICK_Y}
    return Method(
        "ours, websocket",
        {
            OPERATIONS[0]: lambda: call(jpeg()),
            OPERATIONS[1]: lambda: call(png()),
            OPERATIONS[2]: lambda: call(click),
            OPERATIONS[3]: lambda: call(click) + call(jpeg()),
        },
        {
            OPERATIONS[0]: "image bytes received (the agent: XShm grab + libjpeg-turbo)",
            OPERATIONS[1]: "image bytes received (the agent: PNG, ISA-L deflate level 1)",
            OPERATIONS[2]: "press+release written to the X server (the agent: XTEST;"
                           " processed before the next action)",
            OPERATIONS[3]: "the click's reply, then the look's image bytes received",
        },
    )


def ours_rest(http: httpx.Client, session_id: str) -> Method:
    base = f"/v1/sessions/{session_id}"

    looks = {fmt: bench_api.fresh_looks({"format": fmt}) for fmt in ("jpeg", "png")}

    def shot(fmt: str) -> int:
        response = http.get(f"{base}/screenshot", params=looks[fmt]())
        response.raise_for_status()
        return len(response.content)

    def click() -> int:
        http.post(f"{base}/actions",
                  json={"type": "click", "x": CLICK_X, "y": CLICK_Y}).raise_for_status()
        return 0

    return Method(
        "ours, REST",
        {OPERATIONS[0]: lambda: shot("jpeg"), OPERATIONS[1]: lambda: shot("png"),
         OPERATIONS[2]: click, OPERATIONS[3]: lambda: click() + shot("jpeg")},
        {OPERATIONS[0]: "response body received", OPERATIONS[1]: "response body received",
         OPERATIONS[2]: "press+release written to the X server (XTEST; processed before the"
                        " next action)",
         OPERATIONS[3]: "the click's response, then the look's body received"},
    )


# -- xdotool + scrot: one process per action ---------------------------------------------


def spawned(display: str, workdir: Path) -> Method:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DISPLAY": display,
           "HOME": str(workdir)}
    jpeg_path, png_path = workdir / "shot.jpg", workdir / "shot.png"

    def run(argv: Sequence[str]) -> None:
        subprocess.run(argv, env=env, check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def scrot(path: Path, quality: int | None) -> int:
        argv = ["scrot", "--overwrite"]
        if quality is not None:
            argv += ["--quality", str(quality)]
        run([*argv, str(path)])
        return len(path.read_bytes())

    def click() -> int:
        run(["xdotool", "mousemove", str(CLICK_X), str(CLICK_Y), "click", "1"])
        return 0

    return Method(
        "xdotool + scrot (process per action)",
        {OPERATIONS[0]: lambda: scrot(jpeg_path, JPEG_QUALITY),
         OPERATIONS[1]: lambda: scrot(png_path, None), OPERATIONS[2]: click,
         OPERATIONS[3]: lambda: click() + scrot(jpeg_path, JPEG_QUALITY)},
        {OPERATIONS[0]: "scrot exited, file read back",
         OPERATIONS[1]: "scrot exited, file read back",
         OPERATIONS[2]: "xdotool exited (events flushed; its 100 ms default click delay)",
         OPERATIONS[3]: "xdotool exited, then scrot exited and its file read back"},
    )


# -- cua-computer-server (bench/cua_peer.py starts it) -------------------------------------


def cua_method(ws: ClientConnection) -> Method:
    def command(name: str, **params: object) -> dict[str, object]:
        ws.send(json.dumps({"command": name, "params": params}))
        reply = json.loads(ws.recv(timeout=30))
        if not reply.get("success"):
            raise RuntimeError(f"{name}: {reply.get('error')}")
        result: dict[str, object] = reply
        return result

    def shot(fmt: str) -> int:
        params: dict[str, object] = {"format": fmt}
        if fmt == "jpeg":
            params["quality"] = JPEG_QUALITY
        return len(base64.b64decode(str(command("screenshot", **params)["image_data"])))

    def click() -> int:
        command("left_click", x=CLICK_X, y=CLICK_Y)
        return 0

    return Method(
        f"cua-computer-server {cua_peer.pinned_version()}, websocket",
        {OPERATIONS[0]: lambda: shot("jpeg"), OPERATIONS[1]: lambda: shot("png"),
         OPERATIONS[2]: click, OPERATIONS[3]: lambda: click() + shot("jpeg")},
        {OPERATIONS[0]: "JSON with base64 image received (Pillow grab, JPEG optimize=True)",
         OPERATIONS[1]: "JSON with base64 image received (PNG optimize=True)",
         OPERATIONS[2]: "X server processed move, press, release (pynput, XSync each)",
         OPERATIONS[3]: "the click's reply, then the JSON with the base64 image received"},
    )


def start_cua(stack: ExitStack, args: argparse.Namespace, display: str, workdir: Path,
              ) -> Method | str:
    """The cua method, or the reason it is unavailable (never raises for the peer's faults)."""
    if args.no_cua:
        return "skipped (--no-cua)"
    try:
        cua_peer.check_host()
        python = cua_peer.ensure_venv(args.peer_python)
        progress("starting cua-computer-server on the session's display...")
        port = stack.enter_context(cua_peer.server(python, display, workdir))
        ws = stack.enter_context(connect(f"ws://127.0.0.1:{port}/ws", compression=None,
                                         max_size=None, open_timeout=30))
        method = cua_method(ws)
        method.calls[OPERATIONS[2]]()  # fails here, not mid-table, if it cannot click
        return method
    except cua_peer.PeerUnavailable as error:
        return str(error)
    except Exception as error:  # noqa: BLE001 - the peer's failure is a result, not a crash
        return f"{type(error).__name__}: {error}"


# -- measuring -------------------------------------------------------------------------------


def _run(call: Callable[[], int], count: int, result: Result) -> None:
    if result.error:
        return
    try:
        for _ in range(count):
            started = time.perf_counter()
            call()
            result.samples.append(time.perf_counter() - started)
    except Exception as error:  # noqa: BLE001 - a failing method is reported in its row
        result.error = f"{type(error).__name__}: {error}"


def _warm_up(call: Callable[[], int], result: Result) -> None:
    try:
        for _ in range(WARMUP):
            result.size = call()
    except Exception as error:  # noqa: BLE001 - a failing method is reported in its row
        result.error = f"{type(error).__name__}: {error}"


def measure(operation: str, methods: Sequence[Method], iterations: int, page: CdpPage,
            ) -> dict[str, Result]:
    """The methods take turns in ``ROUNDS`` blocks, so a burst of load on the host hits
    them alike; clicks are counted by the page per block."""
    results = {method.name: Result() for method in methods}
    sent = dict.fromkeys(results, 0)
    landed = dict.fromkeys(results, 0)
    counting = operation in CLICKING
    per_round = [iterations // ROUNDS + (i < iterations % ROUNDS) for i in range(ROUNDS)]
    for round_index, count in enumerate([WARMUP, *per_round]):
        for method in methods:
            result = results[method.name]
            before = int(page.evaluate("clicks")) if counting else 0
            samples = len(result.samples)
            if round_index == 0:
                _warm_up(method.calls[operation], result)
                done = WARMUP if not result.error else 0
            else:
                _run(method.calls[operation], count, result)
                done = len(result.samples) - samples
            if counting and done:
                time.sleep(LAND_S)  # let the block's last clicks reach the page
                sent[method.name] += done
                landed[method.name] += int(page.evaluate("clicks")) - before
    if counting:
        for name, result in results.items():
            result.registered = f"{landed[name]}/{sent[name]}"
    return results


def run_all(methods: Sequence[Method], iterations: int, page: CdpPage,
            ) -> dict[tuple[str, str], Result]:
    results: dict[tuple[str, str], Result] = {}
    for operation in OPERATIONS:
        progress(f"{operation}: {len(methods)} methods x {iterations} calls, in turns...")
        for name, result in measure(operation, methods, iterations, page).items():
            results[operation, name] = result
    return results


# -- the table ---------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}" if seconds < 0.1 else f"{seconds * 1000:.0f}"


def render(methods: Sequence[Method], results: dict[tuple[str, str], Result],
           cua_reason: str | None) -> list[str]:
    lines = [
        "| operation | method | p50 ms | p95 ms | n | peer/ours (p50, vs our websocket) "
        "| size KiB | clicks registered | the call returned when |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for operation in OPERATIONS:
        base = results[operation, methods[0].name]
        base_p50 = statistics.median(base.samples) if base.samples else None
        for method in methods:
            result = results[operation, method.name]
            if result.error or not result.samples:
                lines.append(f"| {operation} | {method.name} | – | – | 0 | – | – | – "
                             f"| failed: {result.error} |")
                continue
            p50 = statistics.median(result.samples)
            ratio = f"{p50 / base_p50:.1f}×" if base_p50 else "–"
            size = f"{result.size / 1024:.0f}" if result.size else "–"
            lines.append(
                f"| {operation} | {method.name} | {_ms(p50)} "
                f"| {_ms(bench_api.p95(result.samples))} | {len(result.samples)} | {ratio} "
                f"| {size} | {result.registered or '–'} | {method.guarantees[operation]} |")
        if cua_reason is not None:
            lines.append(f"| {operation} | cua-computer-server | – | – | 0 | – | – | – "
                         f"| not measured: {cua_reason} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--peer-python", help="a Python >= 3.12 for the cua venv")
    parser.add_argument("--no-cua", action="store_true", help="measure without the cua peer")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    bench_api.interrupt_on_sigterm()
    load_before = os.getloadavg()
    local_env = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deskbox-peers-")))
        http = stack.enter_context(bench_api.server(workdir / "state", local_env))
        progress("creating a local session...")
        session_id = bench_api.create(http, PAGE)
        stack.callback(lambda: http.delete(f"/v1/sessions/{session_id}"))
        port = http.base_url.port
        desktop = find_desktop(bench_api.server_pid(http))
        page = stack.enter_context(CdpPage.first(desktop.devtools_url))
        wait_page(page)
        ws_url = f"ws://127.0.0.1:{port}/v1/sessions/{session_id}/actions/ws"
        ws = stack.enter_context(connect(
            ws_url, additional_headers={"Authorization": f"Bearer {bench_api.KEY}"},
            compression=None, max_size=None))
        methods = [ours_ws(ws), ours_rest(http, session_id)]
        cua = start_cua(stack, args, desktop.display, workdir)
        cua_reason = cua if isinstance(cua, str) else None
        if isinstance(cua, Method):
            methods.append(cua)
        else:
            progress(f"cua-computer-server not measured: {cua}")
        methods.append(spawned(desktop.display, workdir))
        results = run_all(methods, args.iterations, page)
    load_after = os.getloadavg()
    print(f"## Peers on one desktop ({WIDTH}x{HEIGHT}, one request in flight, times in ms)\n")
    print("\n".join(render(methods, results, cua_reason)))
    print()
    print(f"- Same Xvfb and page for every method (`deskbox serve`, local backend); JPEG"
          f" quality {JPEG_QUALITY} (ours: 75 and 74 in turn, so that every look is captured"
          " and encoded: the agent reuses the last look's bytes for one asked alike at an"
          f" unchanged screen); {WARMUP} warm-up calls each, then the methods take turns"
          f" in {ROUNDS} blocks; clicks counted by the page (over CDP, {LAND_S} s after each"
          " block; warm-up clicks included).")
    print(f"- Command: `.venv/bin/python bench/peers.py --iterations {args.iterations}`;"
          f" peer pinned in `bench/peers-requirements.txt`, venv `bench/.peers/venv`.")
    print(f"- {os.cpu_count()} CPUs; 1-minute load average {load_before[0]:.2f} before,"
          f" {load_after[0]:.2f} after (other work on the host skews the figures).")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("[peers] interrupted; "
              "the session, the servers and the peer were stopped", file=sys.stderr)
        sys.exit(130)
