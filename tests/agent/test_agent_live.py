"""The live view (x11vnc) and DevTools through the real agent's channels, on a real desktop.

Xvfb + openbox + Chromium run on the host (engines/local/sandbox.py), the agent is a subprocess on
a unix socket (conftest.py); no sandbox. The VNC server is agent/vnc.py, the
DevTools connections agent/devtools_channels.py, both given only an ``AgentClient``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import uvicorn
from playwright.sync_api import sync_playwright
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.exceptions import ConnectionClosed

from deskbox_server.agent import AgentClient, AgentLimits
from deskbox_server.agent.devtools import (
    MAX_LISTING,
    browser_path,
    get_json,
    open_websocket,
)
from deskbox_server.agent.devtools_channels import AgentDevtools
from deskbox_server.agent.vnc import AgentVnc
from deskbox_server.agent.vnc_server import VncServer
from deskbox_server.api.cdp_relay import RelayLimits, SessionBuffers, relay
from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.errors import AgentFailed, BrowserUnavailable, SessionFailed, Timeout
from deskbox_server.vnc.hub import VncHub
from deskbox_server.vnc.proxy import handshake_server, run_proxy
from tests.rfb_client import RfbViewer

from ..cdp_page import CdpPage
from ..local_desktop import HostDesktop as LocalSandbox
from .conftest import start_agent, wait_for

RAW_32BIT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
EVENTS_PAGE = (Path(__file__).parents[1] / "pages" / "events.html").as_uri()
WIDTH, HEIGHT = 640, 400


def colour_page(rgb: str) -> str:
    return f"data:text/html,<body style='margin:0;background:%23{rgb}'></body>"


@pytest.fixture(scope="module")
def desktop() -> Iterator[LocalSandbox]:
    with LocalSandbox(DesktopSpec(width=WIDTH, height=HEIGHT)) as local:
        yield local


@pytest.fixture(scope="module")
def cdp(desktop: LocalSandbox) -> Iterator[CdpPage]:
    with CdpPage.first(desktop.devtools_url) as page:
        yield page


def show(cdp: CdpPage, rgb: str) -> None:
    cdp.navigate(colour_page(rgb))
    cdp.wait_painted(url_prefix="data:")


def share(viewer: RfbViewer, rgb: tuple[int, int, int]) -> float:
    """How much of the viewer's framebuffer has the colour ``rgb``."""
    r, g, b = rgb
    pixels = viewer.frame[:, :, :3]  # B, G, R (and padding)
    return float(((pixels[:, :, 0] == b) & (pixels[:, :, 1] == g) & (pixels[:, :, 2] == r)).mean())


def full_frame(viewer: RfbViewer) -> None:
    viewer.request(incremental=False)
    while viewer.read_message() != 0:
        pass


def frame_until(viewer: RfbViewer, rgb: tuple[int, int, int], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    full_frame(viewer)
    while share(viewer, rgb) < 0.5:  # the page fills most of the screen
        assert time.monotonic() < deadline, f"the screen does not show {rgb}"
        viewer.request(incremental=True)
        while viewer.read_message() != 0:
            pass


# -- a local relay: what the server's proxies do with the streams and sockets we return --

class Relay:
    """A local listener whose every connection is piped to ``open_far()``'s streams."""

    def __init__(self, open_far: Callable[[], Awaitable[tuple[
            asyncio.StreamReader, asyncio.StreamWriter]]]) -> None:
        self._open_far = open_far
        self.writers: set[asyncio.StreamWriter] = set()
        self.bytes_down = 0

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    down: bool) -> None:
        try:
            while data := await reader.read(65536):
                if down:
                    self.bytes_down += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            far_reader, far_writer = await self._open_far()
        except Exception:
            writer.close()
            raise
        self.writers.add(far_writer)
        await asyncio.gather(self._pipe(reader, far_writer, False),
                             self._pipe(far_reader, writer, True))

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        for writer in self.writers:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def unix_relay(path: Path, vnc: AgentVnc) -> AsyncIterator[str]:
    relay = Relay(vnc.connect)
    server = await asyncio.start_unix_server(relay.handle, str(path))
    try:
        async with server:
            yield f"unix:{path}"
    finally:
        await relay.close()


def x11vnc_pids(socket_path: str) -> list[int]:
    """x11vnc processes serving ``socket_path`` (by their command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if argv[0].endswith(b"x11vnc") and socket_path.encode() in argv:
                    found.append(int(entry))
    return found


def shm_segments_of(pid: int) -> int:
    """SysV shared memory segments that ``pid`` created and that still exist."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    header = lines[0].split()
    cpid = header.index("cpid")
    return sum(1 for line in lines[1:] if int(line.split()[cpid]) == pid)


def gone(pid: int) -> bool:
    """The process ended (a zombie counts); ESRCH while reading means it just did."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


# -- VNC ---------------------------------------------------------------------------------

async def test_vnc_through_the_agent_two_viewers_and_stop(
    client: AgentClient, desktop: LocalSandbox, cdp: CdpPage, tmp_path: Path
) -> None:
    await asyncio.to_thread(show, cdp, "33cc66")
    vnc = await AgentVnc.start(client, desktop.display_name, socket_dir=str(tmp_path))
    try:
        assert vnc.failure() is None
        [pid] = x11vnc_pids(vnc.socket_path)
        async with unix_relay(tmp_path / "relay", vnc) as url:
            first = await asyncio.to_thread(RfbViewer, url, 10.0)
            second = await asyncio.to_thread(RfbViewer, url, 10.0)
            try:
                assert (first.width, first.height) == (WIDTH, HEIGHT)
                await asyncio.to_thread(frame_until, first, (0x33, 0xCC, 0x66))
                await asyncio.to_thread(frame_until, second, (0x33, 0xCC, 0x66))
                assert vnc.viewers == 2
                first.close()
                await wait_for(lambda: vnc.viewers == 1)  # its channel is released
                # The other viewer goes on, and sees the screen change.
                await asyncio.to_thread(show, cdp, "c03020")
                await asyncio.to_thread(frame_until, second, (0xC0, 0x30, 0x20))
            finally:
                first.close()
                second.close()
        assert shm_segments_of(pid) > 0  # x11vnc's XShm segments, freed only on SIGTERM
    finally:
        await vnc.stop()
    assert vnc.failure() == "the VNC server was stopped"
    with pytest.raises(SessionFailed, match="stopped"):
        await vnc.connect()
    await wait_for(lambda: gone(pid), 5.0)
    assert shm_segments_of(pid) == 0  # it was stopped with SIGTERM, not SIGKILL
    assert not await asyncio.to_thread(Path(vnc.socket_path).exists)  # removed in the sandbox
    assert vnc.viewers == 0
    assert await client.health() >= 0


@contextlib.asynccontextmanager
async def live_view_server(hub: VncHub, start: Callable[[], Awaitable[VncServer]]
                           ) -> AsyncIterator[str]:
    """A uvicorn on loopback, in this loop, whose one websocket does what api/vnc.py does
    with a session's VNC server: the hub, the server handshake, the proxy."""

    async def vnc_ws(websocket: WebSocket) -> None:
        async with hub.viewer("ses_test", start) as server:
            reader, writer = await server.connect()
            await handshake_server(reader, writer)
            await websocket.accept(subprotocol="binary")
            await run_proxy(websocket, reader, writer, allow_input=True)

    async with serving(Starlette(routes=[WebSocketRoute("/vnc", vnc_ws)])) as port:
        yield f"ws://127.0.0.1:{port}/vnc"


@contextlib.asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[int]:
    """uvicorn on a loopback port, in this loop (so it shares the test's AgentClient)."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           ws="websockets-sansio",
                                           ws_per_message_deflate=False))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_for(lambda: server.started or task.done())
        assert not task.done(), task
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


async def test_the_hub_and_the_proxy_serve_viewers_through_the_agent(
    client: AgentClient, desktop: LocalSandbox, cdp: CdpPage, tmp_path: Path
) -> None:
    """What the lead switches to: vnc/hub.py and vnc/proxy.py, unchanged, over AgentVnc."""
    await asyncio.to_thread(show, cdp, "2040a0")
    hub = VncHub()
    started: list[AgentVnc] = []

    async def start() -> VncServer:
        server = await AgentVnc.start(client, desktop.display_name, socket_dir=str(tmp_path))
        started.append(server)
        return server

    try:
        async with live_view_server(hub, start) as url:
            first = await asyncio.to_thread(RfbViewer, url, 10.0)
            second = await asyncio.to_thread(RfbViewer, url, 10.0)
            try:
                await asyncio.to_thread(frame_until, first, (0x20, 0x40, 0xA0))
                await asyncio.to_thread(frame_until, second, (0x20, 0x40, 0xA0))
                assert len(started) == 1 and hub.viewers("ses_test") == 2  # one x11vnc
                [pid] = x11vnc_pids(started[0].socket_path)
                # The server runs in this loop: the viewers' blocking closes go to threads.
                await asyncio.to_thread(first.close)
                await wait_for(lambda: hub.viewers("ses_test") == 1)
                await asyncio.to_thread(show, cdp, "a02040")
                await asyncio.to_thread(frame_until, second, (0xA0, 0x20, 0x40))
            finally:
                await asyncio.to_thread(first.close)
                await asyncio.to_thread(second.close)
            # The last viewer left: the hub stopped the server, and x11vnc is gone.
            await wait_for(lambda: hub.server("ses_test") is None)
            await wait_for(lambda: gone(pid), 5.0)
    finally:
        await hub.close()
    assert started[0].failure() == "the VNC server was stopped"


async def test_a_stalled_viewer_is_held_back_not_buffered(
    client: AgentClient, desktop: LocalSandbox, tmp_path: Path
) -> None:
    """A viewer that asks for 40 full frames (40 MiB raw) and reads nothing: x11vnc is held
    back by the channel's flow control; what waits on the way is a few MiB."""
    vnc = await AgentVnc.start(client, desktop.display_name, socket_dir=str(tmp_path))
    [pid] = x11vnc_pids(vnc.socket_path)
    try:
        reader, writer = await vnc.connect()
        await handshake_server(reader, writer)
        writer.write(b"\x01")  # ClientInit, shared
        width, height = struct.unpack(">HH", await reader.readexactly(4))
        await reader.readexactly(16)
        (name_length,) = struct.unpack(">I", await reader.readexactly(4))
        await reader.readexactly(name_length)
        writer.write(b"\x00\x00\x00\x00" + RAW_32BIT + struct.pack(">BxHi", 2, 1, 0))
        full = struct.pack(">BBHHHH", 3, 0, 0, 0, width, height)
        writer.write(full * 40)
        await writer.drain()
        await asyncio.sleep(2.0)  # x11vnc sends until something stops it
        assert await client.health() >= 0  # the agent's other calls go on meanwhile
        os.kill(pid, signal.SIGSTOP)  # from here on, count what waited on the way
        try:
            waiting = 0
            with contextlib.suppress(TimeoutError):
                while True:
                    async with asyncio.timeout(1.0):
                        chunk = await reader.read(1 << 20)
                    assert chunk
                    waiting += len(chunk)
        finally:
            os.kill(pid, signal.SIGCONT)
        frame = width * height * 4
        assert frame <= waiting < 8 * 1024 * 1024, waiting  # not 40 frames: a few MiB
        writer.close()
        await wait_for(lambda: vnc.viewers == 0)
    finally:
        await vnc.stop()
    await wait_for(lambda: gone(pid), 5.0)


async def test_vnc_that_exits_says_why(client: AgentClient, tmp_path: Path) -> None:
    with pytest.raises(SessionFailed, match=r"did not start: x11vnc exited \(1\): .*x11vnc"):
        await AgentVnc.start(client, ":9999", socket_dir=str(tmp_path), timeout_s=10)
    assert await client.health() >= 0


# -- DevTools ----------------------------------------------------------------------------

async def _cdp_call(
    devtools: AgentDevtools, path: str, method: str, params: dict[str, object]
) -> dict[str, object]:
    ws = await open_websocket(devtools.open, path, 1 << 20)
    try:
        await ws.send(json.dumps({"id": 1, "method": method, "params": params}))
        async with asyncio.timeout(10):
            while True:
                reply = json.loads(await ws.recv())
                if reply.get("id") == 1:
                    result: dict[str, object] = reply["result"]
                    return result
    finally:
        await ws.close()


async def test_devtools_json_and_websockets_through_the_agent(
    client: AgentClient, desktop: LocalSandbox, cdp: CdpPage
) -> None:
    await asyncio.to_thread(cdp.navigate, EVENTS_PAGE)
    await asyncio.to_thread(cdp.wait_painted, "file:")
    devtools = AgentDevtools(client, desktop.devtools_port or 0)
    try:
        version = await get_json(await devtools.open(), "/json/version", MAX_LISTING)
        assert isinstance(version, dict) and "Chrome" in version["Browser"]
        path = await browser_path(devtools.open)
        result = await _cdp_call(devtools, path, "Browser.getVersion", {})
        assert result["product"] == version["Browser"]
        targets = await get_json(await devtools.open(), "/json/list", MAX_LISTING)
        assert isinstance(targets, list)
        [page] = [t for t in targets if t["type"] == "page"]
        page_path = "/devtools/page/" + page["id"]
        evaluated = await _cdp_call(devtools, page_path, "Runtime.evaluate",
                                    {"expression": "document.title", "returnByValue": True})
        assert evaluated["result"] == {"type": "string", "value": "Deskbox event recorder"}
        await wait_for(lambda: devtools.open_connections == 0)  # each closed its channel
    finally:
        await devtools.close()


async def test_devtools_to_a_port_nobody_listens_on(client: AgentClient) -> None:
    devtools = AgentDevtools(client, 1)  # port 1 on loopback: refused
    with pytest.raises(BrowserUnavailable, match="does not accept DevTools connections"):
        await devtools.open()


def _playwright_title(http_url: str) -> tuple[str, str]:
    with sync_playwright() as playwright:
        started = time.monotonic()
        browser = playwright.chromium.connect_over_cdp(http_url, timeout=20_000)
        try:
            took = time.monotonic() - started
            [page] = [p for c in browser.contexts for p in c.pages]
            return page.evaluate("document.title"), f"{took * 1000:.0f} ms"
        finally:
            browser.close()


async def test_playwright_over_the_agent(
    client: AgentClient, desktop: LocalSandbox, cdp: CdpPage
) -> None:
    await asyncio.to_thread(cdp.navigate, EVENTS_PAGE)
    await asyncio.to_thread(cdp.wait_painted, "file:")
    devtools = AgentDevtools(client, desktop.devtools_port or 0)

    async def open_far() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(sock=(await devtools.open()).sock)

    relay = Relay(open_far)
    server = await asyncio.start_server(relay.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with server:
            title, took = await asyncio.to_thread(_playwright_title, f"http://127.0.0.1:{port}")
    finally:
        await relay.close()
        await devtools.close()
    assert title == "Deskbox event recorder"
    assert relay.bytes_down > 1000, "Playwright's traffic did not pass through the agent"
    print(f"connect_over_cdp through the agent: {took}")


def _playwright_title_ws(ws_url: str) -> str:
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(ws_url, timeout=20_000)
        try:
            [page] = [p for c in browser.contexts for p in c.pages]
            return str(page.evaluate("document.title"))
        finally:
            browser.close()


async def test_playwright_through_the_cdp_relay_and_the_agent(
    client: AgentClient, desktop: LocalSandbox, cdp: CdpPage
) -> None:
    """api/cdp_relay.py's relay, unchanged, between Playwright and an AgentDevtools
    websocket: what api/cdp.py does once ``open_devtools`` is ``AgentDevtools.open``."""
    await asyncio.to_thread(cdp.navigate, EVENTS_PAGE)
    await asyncio.to_thread(cdp.wait_painted, "file:")
    devtools = AgentDevtools(client, desktop.devtools_port or 0)
    limits = RelayLimits(max_message=64 << 20, client_buffer=16 << 20, send_timeout_s=10)
    buffers = SessionBuffers(64 << 20)
    dropped: list[str] = []

    async def cdp_ws(websocket: WebSocket) -> None:
        path = await browser_path(devtools.open)
        upstream = await open_websocket(devtools.open, path, limits.max_message)
        try:
            await websocket.accept()
            await relay(websocket, upstream, buffers, limits, lambda: None, dropped.append)
        finally:
            await upstream.close()  # as api/cdp.py does

    app = Starlette(routes=[WebSocketRoute("/devtools/browser", cdp_ws)])
    try:
        async with serving(app) as port:
            title = await asyncio.to_thread(
                _playwright_title_ws, f"ws://127.0.0.1:{port}/devtools/browser")
        assert title == "Deskbox event recorder" and not dropped
        await wait_for(lambda: devtools.open_connections == 0)  # the relay closed upstream
    finally:
        await devtools.close()


# -- an agent that dies or stops ---------------------------------------------------------

@pytest_asyncio.fixture(loop_scope="function")
async def own_agent(tmp_path: Path) -> AsyncIterator[tuple[AgentClient, int]]:
    proc = await asyncio.to_thread(start_agent, tmp_path / "own.sock")
    agent = await AgentClient.connect_unix(str(tmp_path / "own.sock"), AgentLimits())
    try:
        yield agent, proc.pid
    finally:
        await agent.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        await asyncio.to_thread(proc.wait)
        assert proc.stderr is not None
        proc.stderr.close()


async def test_an_agent_that_dies_mid_stream(
    own_agent: tuple[AgentClient, int], desktop: LocalSandbox, desktop_cdp_port: int,
    tmp_path: Path,
) -> None:
    agent, agent_pid = own_agent
    vnc = await AgentVnc.start(agent, desktop.display_name, socket_dir=str(tmp_path))
    [x11vnc] = x11vnc_pids(vnc.socket_path)
    devtools = AgentDevtools(agent, desktop_cdp_port)
    try:
        path = await browser_path(devtools.open)
        ws = await open_websocket(devtools.open, path, 1 << 20)
        async with unix_relay(tmp_path / "relay", vnc) as url:
            viewer = await asyncio.to_thread(RfbViewer, url, 10.0)
            try:
                await asyncio.to_thread(full_frame, viewer)
                os.kill(agent_pid, signal.SIGKILL)
                started = time.monotonic()
                with pytest.raises((ConnectionError, OSError)):  # noqa: PT012
                    while True:  # the viewer's connection ends: no hang
                        await asyncio.to_thread(viewer.ws.recv, 5.0)
                assert time.monotonic() - started < 5
            finally:
                viewer.close()
        async with asyncio.timeout(5):  # the DevTools websocket ends too: no hang
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        failure = vnc.failure()
        assert failure is not None and "agent failed" in failure
        async with asyncio.timeout(2):
            with pytest.raises(SessionFailed, match="agent failed"):
                await vnc.connect()
            # A killed process's socket ends with EOF, or with a reset where bytes were
            # still unread in it (a busy host).
            with pytest.raises(AgentFailed,
                               match="the agent closed the stream|the stream broke: Connection"):
                await devtools.open()
    finally:
        await vnc.stop()
        await devtools.close()
        # A killed agent could not stop its x11vnc; ours to end (the test made it). Orphaned,
        # it does not always finish its SIGTERM cleanup: SIGKILL after a moment.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.kill(x11vnc, sig)
            with contextlib.suppress(AssertionError):
                await wait_for(lambda: gone(x11vnc), 3.0)
        assert gone(x11vnc)
        with contextlib.suppress(ChildProcessError):  # our child now (we are a subreaper)
            await asyncio.to_thread(os.waitpid, x11vnc, os.WNOHANG)


async def test_an_agent_that_stops_answering_times_out(
    own_agent: tuple[AgentClient, int], desktop_cdp_port: int,
) -> None:
    agent, agent_pid = own_agent
    devtools = AgentDevtools(agent, desktop_cdp_port, connect_timeout_s=0.5)
    os.kill(agent_pid, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(Timeout, match="did not accept a connection"):
        await devtools.open()
    assert time.monotonic() - started < 5
    with pytest.raises(Timeout):
        await AgentVnc.start(agent, ":0", socket_dir="/nonexistent", timeout_s=1.0)
    assert time.monotonic() - started < 8  # its stop does not wait for the agent either


@pytest.fixture
def desktop_cdp_port(desktop: LocalSandbox) -> int:
    assert desktop.devtools_port is not None
    return desktop.devtools_port
