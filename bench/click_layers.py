"""Where a websocket click's time goes, layer by layer, on one desktop, against cua's click.

Run from the repository root (no root needed; cua's venv as bench/peers.py makes it)::

    .venv/bin/python bench/click_layers.py [--iterations 200] [--no-cua]

It starts ``deskbox serve`` with the ``local`` backend and one session on bench/peers.py's
click-counting page, then clicks the same spot through each layer in turn (``ROUNDS``
blocks, so load on the host hits them alike), one click in flight:

- ``ws``: our actions websocket through the server, as bench/peers.py (the whole path);
- ``agent``: the host's ``AgentDesktop.perform(Click)`` over a second connection straight to
  the session's agent socket (the agent's round trip without the server);
- ``echo``: ``AgentClient.call("echo", {})`` on that connection (the protocol's floor);
- ``service``: in a separate process on the same display and agent package, the agent's
  ``DesktopService.act`` awaited directly (its worker-thread hop, parsing, X work and reply
  body, without the protocol);
- ``hop``: that process's X work (below) on a worker thread, awaited from its event loop
  (a thread hop; the service sends a single click from its loop, without one);
- ``X work``: that process's ``Desktop.send_pointer(click)`` until ``pointer_confirmed``
  (XTEST press and release and the round trip after them; the service replies after the
  send and waits for the round trip before the next click);
- ``cua``: cua-computer-server's ``left_click`` through its websocket;
- ``relay``: 150 bytes sent to one more process and echoed back (asyncio, a unix socket):
  the floor of what one more process on the path costs here, as the agent is on ours and
  not on cua's.

Prints p50/p95, the CPU each process spent per click (from /proc/PID/task/*/schedstat;
Chromium's processes summed, and openbox, which every click goes through for its
click-to-focus: what the desktop itself spends beside us on the same CPUs), the server's own
mean ``Session.act`` time during the ``ws`` blocks (its
``deskbox_action_duration_seconds`` histogram), and how many clicks the page counted.
Then lone calls through ``ws``, ``agent``, ``echo``, ``service``, ``relay`` and ``cua``
after the desktop sat idle for ``COLD_RESTS_S`` (``--cold-reps`` each, in turns): an
agent's clicks come seconds apart, after a model's turn, when every process on the path
starts with cold caches.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack, suppress
from pathlib import Path

import api as bench_api  # bench/api.py: the server helper
import cua_peer  # bench/cua_peer.py: the peer's venv and server
import httpx
import peers  # bench/peers.py: the page, the desktop's processes, the methods
from websockets.sync.client import connect

from deskbox_server.agent import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.engines.local.sandbox import agent_package_dir
from deskbox_server.schemas import actions as a
from deskbox_server.settle import SettleOptions

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests/ (its CdpPage)
from tests.cdp_page import CdpPage  # noqa: E402

ROUNDS = 5
WARMUP = 10
REST_S = 0.3  # between blocks: the page's click handling goes quiet
# Idle times before a lone click (see the module's docstring).
COLD_RESTS_S = (0.1, 0.5, 2.0)
COLD_LAYERS = ("ws", "agent", "echo", "service", "relay", "cua")

# Runs in its own process with the agent's package: one line "service N", "hop N" or
# "xwork N" in,
# one JSON list of N durations (s) out.
IN_PROCESS = r"""
import asyncio, json, select, sys, time
from concurrent.futures import ThreadPoolExecutor
from deskbox_agent.desktop import actions as A
from deskbox_agent.desktop.desktop import Desktop
from deskbox_agent.desktop.service import DesktopService
display, x, y, settle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
args = {"actions": [{"type": "click", "x": x, "y": y}], "view": None, "screenshot": None,
        "settle": settle}
def x_work(desktop, action, options):
    desktop.send_pointer(action, None, options)
    while not desktop.pointer_confirmed():
        select.select([desktop.x_connection.fileno()], [], [], 1.0)
async def main():
    service, desktop = DesktopService(display), Desktop(display)
    [action], options = A.parse_actions(args["actions"]), A.parse_settle(settle)
    loop, worker = asyncio.get_running_loop(), ThreadPoolExecutor(max_workers=1)
    for line in sys.stdin:
        kind, n = line.split()
        out = []
        for _ in range(int(n)):
            started = time.perf_counter()
            if kind == "service":
                await service.act(args)
            elif kind == "hop":
                await loop.run_in_executor(worker, x_work, desktop, action, options)
            else:
                x_work(desktop, action, options)
            out.append(time.perf_counter() - started)
        print(json.dumps(out), flush=True)
asyncio.run(main())
"""

# One more process on the path and nothing else: echoes what it reads on a unix socket.
RELAY = r"""
import asyncio, sys
async def echo(reader, writer):
    while data := await reader.read(65536):
        writer.write(data)
async def main():
    server = await asyncio.start_unix_server(echo, sys.argv[1])
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""
RELAY_MESSAGE = b"x" * 150  # about a click's message on the agent's stream


def cpu_s(*pids: int) -> float:
    """CPU seconds of all the processes' threads (schedstat: nanoseconds); a process that
    is gone counts for nothing."""
    total = 0
    for pid in pids:
        with suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with suppress(OSError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def timed(call: Callable[[], object], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


async def timed_async(call: Callable[[], Awaitable[object]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


def act_histogram(http: httpx.Client) -> tuple[float, float]:
    """(sum s, count) of the server's click actions so far."""
    found = {"_sum": 0.0, "_count": 0.0}
    for line in http.get("/metrics").text.splitlines():
        for suffix in found:
            if (line.startswith(f"deskbox_action_duration_seconds{suffix}")
                    and 'type="click"' in line):
                found[suffix] = float(line.split()[-1])
    return found["_sum"], found["_count"]


def argv_of(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def cua_pid(port: int) -> int:
    """The ``python -m computer_server --port PORT`` process that cua_peer.server started."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        argv = argv_of(int(cmdline.parent.name))
        if "computer_server" in argv and str(port) in argv:
            return int(cmdline.parent.name)
    raise SystemExit("could not find cua-computer-server's process")


@dataclasses.dataclass(frozen=True)
class LocalDesktop:
    """The processes of one local session and its agent's unix socket."""

    agent: int
    agent_socket: str
    xvfb: int
    wm: tuple[int, ...]
    browser: tuple[int, ...]  # Chromium's processes: the browser, its zygote, renderers


def local_desktop(server_pid: int) -> LocalDesktop:
    """The processes of the server's one local session, as they are once its page is
    loaded (a renderer started later is not counted)."""
    agent = xvfb = None
    socket_path = ""
    wm: list[int] = []
    browser: list[int] = []
    for pid in peers.descendants(server_pid):
        argv = argv_of(pid)
        name = Path(argv[0]).name if argv else ""
        if "deskbox_agent" in argv and "--listen" in argv:
            agent = pid
            socket_path = argv[argv.index("--listen") + 1].removeprefix("unix:")
        elif name == "Xvfb":
            xvfb = pid
        elif name == "openbox":
            wm.append(pid)
        elif name.startswith(("chromium", "chrome")):
            browser.append(pid)
    if agent is None or xvfb is None or not browser:
        raise SystemExit("could not find the session's agent, Xvfb and browser")
    return LocalDesktop(agent, socket_path, xvfb, tuple(wm), tuple(browser))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--no-cua", action="store_true")
    parser.add_argument("--cold-reps", type=int, default=10,
                        help="lone clicks per idle time and layer (0: none)")
    args = parser.parse_args()
    bench_api.interrupt_on_sigterm()
    load_before = os.getloadavg()[0]
    loop = asyncio.new_event_loop()
    per_block = max(1, args.iterations // ROUNDS)
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deskbox-click-")))
        http = stack.enter_context(bench_api.server(
            workdir / "state", {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}))
        session_id = bench_api.create(http, peers.PAGE)
        stack.callback(lambda: http.delete(f"/v1/sessions/{session_id}"))
        server_pid = bench_api.server_pid(http)
        desktop = peers.find_desktop(server_pid)
        page = stack.enter_context(CdpPage.first(desktop.devtools_url))
        peers.wait_page(page)
        processes = local_desktop(server_pid)
        ws = stack.enter_context(connect(
            f"ws://127.0.0.1:{http.base_url.port}/v1/sessions/{session_id}/actions/ws",
            additional_headers={"Authorization": f"Bearer {bench_api.KEY}"},
            compression=None, max_size=None))
        ours = peers.ours_ws(ws)
        client = loop.run_until_complete(AgentClient.connect_unix(processes.agent_socket))
        stack.callback(lambda: loop.run_until_complete(client.close()))
        direct = AgentDesktop(client)
        click = a.Click(x=peers.CLICK_X, y=peers.CLICK_Y)
        settle = json.dumps(dataclasses.asdict(SettleOptions()))
        in_process = subprocess.Popen(
            [sys.executable, "-c", IN_PROCESS, desktop.display, str(peers.CLICK_X),
             str(peers.CLICK_Y), settle],
            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(agent_package_dir())})
        stack.callback(in_process.wait)
        stack.callback(in_process.kill)
        assert in_process.stdin is not None and in_process.stdout is not None
        stdin, stdout = in_process.stdin, in_process.stdout

        def in_process_block(kind: str, n: int) -> list[float]:
            stdin.write(f"{kind} {n}\n")
            stdin.flush()
            samples: list[float] = json.loads(stdout.readline())
            return samples

        relay_path = str(workdir / "relay.sock")
        relay = subprocess.Popen([sys.executable, "-c", RELAY, relay_path], text=True,
                                 stdout=subprocess.PIPE)
        stack.callback(relay.wait)
        stack.callback(relay.kill)
        assert relay.stdout is not None and relay.stdout.readline() == "ready\n"
        relay_socket = stack.enter_context(socket.socket(socket.AF_UNIX))
        relay_socket.connect(relay_path)

        def relay_round_trip() -> None:
            relay_socket.sendall(RELAY_MESSAGE)
            received = 0
            while received < len(RELAY_MESSAGE):
                chunk = relay_socket.recv(65536)
                if not chunk:
                    raise SystemExit("the relay process went away")
                received += len(chunk)

        layers: dict[str, Callable[[int], list[float]]] = {
            "ws: through the server": lambda n: timed(ours.calls["click"], n),
            "agent: AgentDesktop straight to the agent's socket": lambda n: (
                loop.run_until_complete(timed_async(lambda: direct.perform(click), n))),
            "echo: the protocol's floor": lambda n: loop.run_until_complete(
                timed_async(lambda: client.call("echo", {}), n)),
            "service: DesktopService.act, no protocol": lambda n: in_process_block("service", n),
            "hop: the X work on a worker thread, awaited": lambda n: in_process_block(
                "hop", n),
            "X work: Desktop.send_pointer until confirmed": lambda n: in_process_block("xwork", n),
            "relay: 150 bytes echoed by one more process": lambda n: timed(relay_round_trip, n),
        }
        pids: dict[str, tuple[int, ...]] = {
            "server": (server_pid,), "agent": (processes.agent,), "Xvfb": (processes.xvfb,),
            "Chromium": processes.browser, "openbox": processes.wm,
            "in-process": (in_process.pid,), "relay": (relay.pid,)}
        if not args.no_cua:
            python = cua_peer.ensure_venv(None)
            port = stack.enter_context(cua_peer.server(python, desktop.display, workdir))
            cua_ws = stack.enter_context(connect(f"ws://127.0.0.1:{port}/ws", compression=None,
                                                 max_size=None, open_timeout=30))
            cua = peers.cua_method(cua_ws)
            layers["cua: left_click through its websocket"] = lambda n: timed(
                cua.calls["click"], n)
            pids["cua"] = (cua_pid(port),)
        samples: dict[str, list[float]] = {name: [] for name in layers}
        cpu = {name: dict.fromkeys(pids, 0.0) for name in layers}
        in_server = [0.0, 0.0]
        landed = dict.fromkeys(layers, 0)
        for round_index in range(ROUNDS + 1):
            for name, run in layers.items():
                histogram = act_histogram(http) if name.startswith("ws") else None
                clicks = int(page.evaluate("clicks"))
                before = {kind: cpu_s(*group) for kind, group in pids.items()}
                got = run(WARMUP if round_index == 0 else per_block)
                after = {kind: cpu_s(*group) for kind, group in pids.items()}
                time.sleep(REST_S)  # the block's last clicks reach the page
                landed[name] += int(page.evaluate("clicks")) - clicks
                if round_index:
                    samples[name] += got
                    for kind in pids:
                        cpu[name][kind] += after[kind] - before[kind]
                    if histogram is not None:
                        now = act_histogram(http)
                        in_server[0] += now[0] - histogram[0]
                        in_server[1] += now[1] - histogram[1]
        cold_layers = {name: run for name, run in layers.items()
                       if name.startswith(COLD_LAYERS)}
        cold: dict[tuple[float, str], list[float]] = {
            (rest, name): [] for rest in COLD_RESTS_S for name in cold_layers}
        for rest in COLD_RESTS_S if args.cold_reps > 0 else ():
            peers.progress(f"lone clicks after {rest:g} s idle: {args.cold_reps} per layer")
            for _ in range(args.cold_reps):
                for name, run in cold_layers.items():
                    time.sleep(rest)
                    cold[rest, name] += run(1)
    print(f"## A websocket click, layer by layer ({args.iterations} per layer, in turns)\n")
    print("| layer | p50 ms | p95 ms | n | clicks the page counted | CPU per click, µs: "
          + " / ".join(pids) + " |")
    print("|---|---:|---:|---:|---:|---|")
    for name, got in samples.items():
        spent = " / ".join(f"{cpu[name][kind] / len(got) * 1e6:.0f}" for kind in pids)
        clicking = not name.startswith(("echo", "relay"))
        counted = f"{landed[name]}/{len(got) + WARMUP}" if clicking else "–"
        print(f"| {name} | {statistics.median(got) * 1000:.2f} "
              f"| {bench_api.p95(got) * 1000:.2f} | {len(got)} | {counted} | {spent} |")
    ws_samples = samples["ws: through the server"]
    print(f"\n- The server's own `Session.act` (its histogram) during the ws blocks: mean"
          f" {in_server[0] / max(1.0, in_server[1]) * 1000:.2f} ms; the ws round trip's mean"
          f" {statistics.mean(ws_samples) * 1000:.2f} ms.")
    ws_cpu = sum(cpu["ws: through the server"][kind] for kind in pids
                 if kind not in ("in-process", "relay", "cua")) / len(ws_samples)
    print(f"- A ws click's CPU in all (server, agent, Xvfb, Chromium, openbox): {ws_cpu * 1e6:.0f}"
          f" µs, {ws_cpu / statistics.mean(ws_samples):.2f} CPUs busy while clicks run back to"
          f" back (of {os.cpu_count()}).")
    print("- Clicks counted per layer include its warm-up clicks, each block's last ones"
          f" given {REST_S:g} s to reach the page.")
    print(f"- {os.cpu_count()} CPUs; 1-minute load average {load_before:.2f} before,"
          f" {os.getloadavg()[0]:.2f} after.")
    if args.cold_reps > 0:
        print(f"\n## A lone click after the desktop sat idle ({args.cold_reps} per idle time"
              " and layer, in turns; p50 ms)\n")
        print("| idle before the click | " + " | ".join(n.split(":")[0] for n in cold_layers)
              + " |")
        print("|---|" + "---:|" * len(cold_layers))
        for rest in COLD_RESTS_S:
            print(f"| {rest:g} s | " + " | ".join(
                f"{statistics.median(cold[rest, name]) * 1000:.2f}" for name in cold_layers)
                + " |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("[click_layers] interrupted; the session and servers were stopped",
              file=sys.stderr)
        sys.exit(130)
