"""The live view and DevTools through the agent's channels vs straight from the host.

Run from the repository root::

    .venv/bin/python bench/agent_live.py [--runs 10] [--frames 20] [--evals 200]

One desktop on the host (Xvfb 1280x800 + openbox + Chromium, tests/local_desktop.py) and the
real ``deskbox-agent`` as a subprocess on a unix socket; no sandbox, so both columns miss
runc's own costs (``runc exec`` for x11vnc today, nothing for the agent). Side by side:

- VNC, through the one interface the hub uses (``VncServer.start``/``connect``): today's
  ``HostVnc`` (x11vnc on a host unix socket, connected directly) and ``AgentVnc`` (x11vnc
  as an agent exec, each connection an agent channel bridged to a socket pair). Server
  start + connect → first full frame, and full-frame updates, raw 32-bit, read by the same
  asyncio RFB client; the host process's CPU per full frame;
- DevTools: Playwright ``connect_over_cdp`` straight to Chromium's port, and through a
  local relay whose every connection is one ``AgentDevtools.open()``; then
  ``Runtime.evaluate`` round trips over ``open_websocket`` with each opener.

Prints a markdown table: median (p95).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from deskbox_server.agent import AgentClient  # noqa: E402
from deskbox_server.agent.devtools import (  # noqa: E402
    MAX_LISTING,
    DevtoolsSocket,
    connect_tcp,
    get_json,
    open_websocket,
)
from deskbox_server.agent.devtools_channels import AgentDevtools  # noqa: E402
from deskbox_server.agent.vnc import AgentVnc  # noqa: E402
from deskbox_server.agent.vnc_server import VncServer, x11vnc_argv  # noqa: E402
from deskbox_server.vnc.proxy import handshake_server  # noqa: E402
from tests.cdp_page import CdpPage  # noqa: E402
from tests.local_desktop import HostDesktop as LocalSandbox  # noqa: E402

RAW_32BIT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
PAGE = (ROOT / "tests" / "pages" / "events.html").as_uri()


def note(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def summary(samples: Sequence[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:.1f} ms ({p95 * 1000:.1f})"


class Rfb:
    """The client side of RFB over asyncio streams: raw 32-bit full frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def handshake(self) -> None:
        await handshake_server(self.reader, self.writer)
        self.writer.write(b"\x01")  # shared
        self.width, self.height = struct.unpack(">HH", await self.reader.readexactly(4))
        await self.reader.readexactly(16)
        (name,) = struct.unpack(">I", await self.reader.readexactly(4))
        await self.reader.readexactly(name)
        self.writer.write(b"\x00\x00\x00\x00" + RAW_32BIT + struct.pack(">BxHi", 2, 1, 0))

    async def full_frame(self) -> int:
        """Ask for the whole screen and read the update; its pixel bytes."""
        self.writer.write(struct.pack(">BBHHHH", 3, 0, 0, 0, self.width, self.height))
        while True:
            kind = (await self.reader.readexactly(1))[0]
            if kind == 0:
                break
            if kind == 1:
                _, _, count = struct.unpack(">BHH", await self.reader.readexactly(5))
                await self.reader.readexactly(6 * count)
            elif kind == 3:
                (length,) = struct.unpack(">3xI", await self.reader.readexactly(7))
                await self.reader.readexactly(length)
        _, rects = struct.unpack(">BH", await self.reader.readexactly(3))
        size = 0
        for _ in range(rects):
            _, _, w, h, _ = struct.unpack(">HHHHi", await self.reader.readexactly(12))
            await self.reader.readexactly(w * h * 4)
            size += w * h * 4
        return size

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def vnc_figures(
    start: Callable[[], Awaitable[VncServer]], runs: int, frames: int
) -> tuple[list[float], list[float], float]:
    """(start + connect → first full frame) per run; full-frame times; host CPU per frame."""
    firsts: list[float] = []
    updates: list[float] = []
    cpu = 0.0
    for _ in range(runs):
        began = time.perf_counter()
        server = await start()
        try:
            rfb = Rfb(*await server.connect())
            await rfb.handshake()
            await rfb.full_frame()
            firsts.append(time.perf_counter() - began)
            cpu_before = time.process_time()
            for _ in range(frames):
                t = time.perf_counter()
                assert await rfb.full_frame() == rfb.width * rfb.height * 4
                updates.append(time.perf_counter() - t)
            cpu += time.process_time() - cpu_before
            await rfb.close()
        finally:
            await server.stop()
    return firsts, updates, cpu / (runs * frames)


def playwright_connects(url: str, runs: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as playwright:
        for _ in range(runs):
            t = time.perf_counter()
            browser = playwright.chromium.connect_over_cdp(url, timeout=20_000)
            [page] = [p for c in browser.contexts for p in c.pages]
            assert page.evaluate("document.title") == "Deskbox event recorder"
            times.append(time.perf_counter() - t)
            browser.close()
    return times


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def relayed_connects(devtools: AgentDevtools, runs: int) -> list[float]:
    """Playwright through a local TCP relay; every connection one agent channel."""
    writers: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        far_reader, far_writer = await asyncio.open_connection(sock=(await devtools.open()).sock)
        writers.extend((writer, far_writer))
        await asyncio.gather(_pipe(reader, far_writer), _pipe(far_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        times = await asyncio.to_thread(playwright_connects, f"http://127.0.0.1:{port}", runs)
    for writer in writers:
        writer.close()
    return times


async def evaluations(open_devtools: Callable[[], Awaitable[DevtoolsSocket]], target: str,
                      count: int) -> list[float]:
    ws = await open_websocket(open_devtools, target, 1 << 20)
    times = []
    try:
        for n in range(count):
            t = time.perf_counter()
            await ws.send(json.dumps({"id": n, "method": "Runtime.evaluate",
                                      "params": {"expression": "1 + 1"}}))
            while json.loads(await ws.recv()).get("id") != n:
                pass
            times.append(time.perf_counter() - t)
    finally:
        await ws.close()
    return times


class HostVnc(VncServer):
    """x11vnc as a host process, connected directly: the baseline for AgentVnc."""

    def __init__(self, proc: asyncio.subprocess.Process, path: Path) -> None:
        self._proc, self.path = proc, path

    @classmethod
    async def start(cls, display: str, directory: Path) -> HostVnc:
        path = directory / f"vnc-{time.monotonic_ns()}"
        proc = await asyncio.create_subprocess_exec(
            *x11vnc_argv(display, str(path)), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = cls(proc, path)
        deadline = time.monotonic() + 15
        while True:
            try:
                _, writer = await asyncio.open_unix_connection(str(path))
            except OSError:
                if proc.returncode is not None or time.monotonic() > deadline:
                    await server.stop()
                    raise RuntimeError("x11vnc did not start") from None
                await asyncio.sleep(0.01)
                continue
            writer.close()
            await writer.wait_closed()
            return server

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.path), limit=1 << 20)

    def failure(self) -> str | None:
        code = self._proc.returncode
        return None if code is None else f"x11vnc exited ({code})"

    async def stop(self) -> None:
        if self._proc.returncode is None:
            self._proc.terminate()  # x11vnc frees its shared memory only on a signal it handles
            try:
                await asyncio.wait_for(self._proc.wait(), 2.0)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        with contextlib.suppress(OSError):
            self.path.unlink()


async def measure(args: argparse.Namespace, agent_socket: Path, desktop: LocalSandbox,
                  directory: Path) -> list[tuple[str, str, str]]:
    agent = await AgentClient.connect_unix(str(agent_socket))
    try:
        port = desktop.devtools_port
        assert port is not None
        rows: list[tuple[str, str, str]] = []

        note("VNC, host direct")
        host_first, host_frames, host_cpu = await vnc_figures(
            lambda: HostVnc.start(desktop.display_name, directory), args.runs, args.frames)
        note("VNC, through the agent")
        agent_first, agent_frames, agent_cpu = await vnc_figures(
            lambda: AgentVnc.start(agent, desktop.display_name, str(directory)),
            args.runs, args.frames)
        rows += [
            ("VNC: server start + connect → first full frame", summary(host_first),
             summary(agent_first)),
            ("VNC: full-frame update (4 MB raw)", summary(host_frames), summary(agent_frames)),
            ("VNC: host CPU per full frame", f"{host_cpu * 1000:.1f} ms",
             f"{agent_cpu * 1000:.1f} ms"),
        ]

        devtools = AgentDevtools(agent, port)
        note("Playwright")
        direct = await asyncio.to_thread(
            playwright_connects, f"http://127.0.0.1:{port}", args.runs)
        relayed = await relayed_connects(devtools, args.runs)
        rows.append(("Playwright connect_over_cdp + one evaluate", summary(direct),
                     summary(relayed)))

        def direct_open() -> Awaitable[DevtoolsSocket]:
            return connect_tcp(port)

        note("CDP evaluations")
        targets = await get_json(await connect_tcp(port), "/json/list", MAX_LISTING)
        assert isinstance(targets, list)
        page = next(t for t in targets if t["type"] == "page")
        target = f"/devtools/page/{page['id']}"
        rows.append(("CDP Runtime.evaluate round trip",
                     summary(await evaluations(direct_open, target, args.evals)),
                     summary(await evaluations(devtools.open, target, args.evals))))
        await devtools.close()
        return rows
    finally:
        await agent.close()


def main(args: argparse.Namespace) -> None:
    directory = Path(tempfile.mkdtemp(prefix="deskbox-bench-"))
    agent_socket = directory / "agent.sock"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "desktop_image" / "agent")}
    agent_proc = subprocess.Popen(
        [sys.executable, "-m", "deskbox_agent", "--listen", f"unix:{agent_socket}"], env=env)
    desktop = LocalSandbox()
    try:
        for _ in range(500):
            if agent_socket.exists():
                break
            time.sleep(0.01)
        with CdpPage.first(desktop.devtools_url) as cdp:
            cdp.navigate(PAGE)
            cdp.wait_painted(url_prefix="file:")
        rows = asyncio.run(measure(args, agent_socket, desktop, directory))
        print(f"\n| 1280×800, n {args.runs} runs / {args.frames} frames / {args.evals} evals"
              " | host direct (today, no runc) | through the agent |")
        print("|---|---|---|")
        for name, host, through in rows:
            print(f"| {name} | {host} | {through} |")
    finally:
        desktop.stop()
        agent_proc.terminate()
        agent_proc.wait(5)
        with contextlib.suppress(OSError):
            agent_socket.unlink()
            directory.rmdir()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--evals", type=int, default=200)
    main(parser.parse_args())
