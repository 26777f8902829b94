"""Slow and malicious clients: the server bounds what it holds for them and drops them,
while everyone else is served as usual.

- an actions websocket client that sends thousands of screenshot requests and reads no
  reply: the server stops reading after MAX_IN_FLIGHT (its requests stay in the socket),
  runs no more than that, drops the client after ``ws_send_timeout_s``;
- a live-view viewer that asks for frames and reads none: the proxy drops it (outbox over
  ``vnc_viewer_buffer_bytes``, or nothing taken for ``ws_send_timeout_s``) while another
  viewer of the same session keeps getting whole frames;
- request bodies that stop arriving (a JSON body, a file upload): 408 ``timeout`` after
  ``body_idle_timeout_s``, the connection closed, the sandbox's writer gone;
- a download that its client stops reading: cut after ``ws_send_timeout_s``, its transfer
  slot given back;
- connections that send no whole request head (nothing, half a head, a header line now
  and then): closed ``request_head_timeout_s`` after they opened or after their last
  answer.

The server runs in this process (a uvicorn thread), so this process's RSS is the server's
plus the test's own small buffers: growth is asserted with a generous margin.
"""

from __future__ import annotations

import base64
import ctypes
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from deskbox_server.api.actions import CLOSE_STALLED, MAX_IN_FLIGHT
from deskbox_server.api.auth import key_id
from deskbox_server.settings import Settings

from ..images import session_image
from ..rfb_client import RfbViewer
from .conftest import DISPLAY, KEY_A, Server, running_server
from .containers import container_server, open_session
from .helpers import assert_error, raw_exchange, server_log
from .raw_ws import RawWebSocket

MIB = 1024 * 1024
STALL_S = 3.0  # ws_send_timeout_s and body_idle_timeout_s of these servers
AUTH = {"Authorization": f"Bearer {KEY_A}"}
# Random pixels: every screenshot of it is large (JPEG q90 ≈ 1 MB at 1280x800).
_NOISE_HTML = """<!doctype html><body style="margin:0;overflow:hidden">
<canvas id="c" width="1400" height="900"></canvas><script>
const c = document.getElementById('c').getContext('2d'), d = c.createImageData(1400, 900);
for (let i = 0; i < d.data.length; i++) d.data[i] = (i & 3) === 3 ? 255 : Math.random() * 256;
c.putImageData(d, 0, 0);
</script></body>"""
NOISE_PAGE = "data:text/html;base64," + base64.b64encode(_NOISE_HTML.encode()).decode()
BIG_SHOT = {"type": "screenshot", "format": "jpeg", "quality": 90}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def settle(value: Callable[[], float], quiet_s: float = 1.0, timeout_s: float = 60) -> float:
    """``value()`` once it has stopped changing for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = value(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, "the value kept changing"
        time.sleep(0.1)
        if (now := value()) != last:
            last, since = now, time.monotonic()
    return last


# -- an actions client that never reads ---------------------------------------------------


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("slow-state"),
        api_keys=[KEY_A],
        backends=["local"],
        default_backend="local",
        ws_send_timeout_s=STALL_S,
        body_idle_timeout_s=STALL_S,
        request_head_timeout_s=STALL_S,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="module")
def noise_session(local_server: Server) -> Iterator[dict[str, Any]]:
    with local_server.client() as http:
        response = http.post("/v1/sessions", json={
            "display": DISPLAY, "browser": {"start_url": NOISE_PAGE},
        })
        assert response.status_code == 201, response.text
        session: dict[str, Any] = response.json()
        try:
            # The create answers once the page has loaded; its noise is drawn by a script
            # after that, which a fast client could beat.
            deadline = time.monotonic() + 20
            while len(http.get(f"/v1/sessions/{session['id']}/screenshot",
                               params={"format": "png"}).content) < 200_000:
                assert time.monotonic() < deadline, "the noise page never drew its noise"
                time.sleep(0.05)
            yield session
        finally:
            http.delete(f"/v1/sessions/{session['id']}")


def ws_action(ws: Any, message_id: int, action: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"id": message_id, "action": action}))
    reply: dict[str, Any] = json.loads(ws.recv(timeout=20))
    for _ in range(reply.get("binary_frames", 0)):
        ws.recv(timeout=20)
    return reply


def test_actions_client_that_reads_no_reply(
    local_server: Server, noise_session: dict[str, Any]
) -> None:
    url = local_server.ws_url(noise_session["id"])
    metrics = local_server.services.metrics

    def screenshots() -> float:
        return metrics.actions.value("screenshot", "ok")

    with connect(url, additional_headers=AUTH, compression=None, max_size=None) as ws:
        for n in range(5):  # warm: the encoder's and the allocator's first buffers
            assert ws_action(ws, n, BIG_SHOT)["ok"]
        assert ws_action(ws, 9, BIG_SHOT)["result"]["size"] > 200_000  # the noise is there
    before, rss_before = screenshots(), rss_bytes()
    dropped = metrics.slow_clients.value("actions")

    with RawWebSocket(url, headers=AUTH) as slow:
        sent = 0
        while sent < 2000 and slow.try_send_text(
            json.dumps({"id": sent, "action": BIG_SHOT}), timeout_s=5
        ):
            sent += 1
        assert sent > 2 * MAX_IN_FLIGHT
        # The server ran what fits in its window and stopped reading; the rest of the
        # 2000 requests wait in the sockets' buffers, not in the server.
        ran = settle(screenshots) - before
        assert MAX_IN_FLIGHT <= ran <= 2 * MAX_IN_FLIGHT, ran
        rss_stalled = rss_bytes()

        # Everyone else is served meanwhile, on the same session too.
        with connect(url, additional_headers=AUTH, compression=None, max_size=None) as other:
            for n in range(10):
                started = time.monotonic()
                assert ws_action(other, n, {"type": "cursor_position"})["ok"]
                assert time.monotonic() - started < 5
            assert ws_action(other, 10, BIG_SHOT)["ok"]
        with local_server.client() as http:
            assert http.get("/healthz").status_code == 200

        # After ws_send_timeout_s without taking a reply, the client is dropped (reading
        # sooner would count as taking replies): what was in flight, then the end (a 1008
        # close, or the socket closed).
        wait_for(lambda: metrics.slow_clients.value("actions") == dropped + 1, 60,
                 "the stalled client dropped")
        replies, closed = slow.drain(timeout_s=30)
    assert closed is not None, "the server kept the stalled client"
    assert closed.code in (None, CLOSE_STALLED), closed
    texts = [json.loads(m) for m in replies if isinstance(m, str)]
    assert len(texts) <= 2 * MAX_IN_FLIGHT
    assert all(t["ok"] and t["id"] == n for n, t in enumerate(texts))
    assert settle(screenshots) - before <= 2 * MAX_IN_FLIGHT + 1
    # ~70 screenshots of ~1 MB were held at most; 2000 would have been ~2 GB.
    assert rss_stalled - rss_before < 400 * MIB, (rss_before, rss_stalled)
    assert rss_bytes() - rss_before < 400 * MIB


def test_json_body_that_stops_arriving(
    local_server: Server, noise_session: dict[str, Any]
) -> None:
    host, port = local_server.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/sessions/{noise_session['id']}/actions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {KEY_A}\r\nContent-Type: application/json\r\n"
        "Content-Length: 200\r\n\r\n"
    ).encode()
    started = time.monotonic()
    status, body = stalled_request(local_server.url, head + b'{"type": "cursor_')
    # Answered and closed at once (uvicorn's keep-alive timeout would add 5 s).
    assert STALL_S - 0.5 <= time.monotonic() - started < STALL_S + 2
    assert status == 408 and json.loads(body)["error"]["type"] == "timeout", body
    with local_server.client() as http:  # the session is fine
        response = http.post(f"/v1/sessions/{noise_session['id']}/actions",
                             json={"type": "cursor_position"})
        assert response.status_code == 200, response.text


def test_connections_that_send_no_whole_request_head_are_closed(local_server: Server) -> None:
    """Slowloris: uvicorn alone kept each of these open for ever (its keep-alive timeout
    counts only the quiet between requests, and any byte resets it)."""
    host, port = local_server.url.removeprefix("http://").split(":")
    metrics = local_server.services.metrics
    dropped = metrics.slow_clients.value("request_head")
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    started = time.monotonic()
    connections = {name: socket.create_connection((host, int(port)), timeout=30)
                   for name in ("trickle", "silent", "half a head", "kept alive")}
    try:
        connections["trickle"].sendall(head)
        connections["half a head"].sendall(head)
        kept = connections["kept alive"]
        kept.sendall(head + b"\r\n")
        answer = kept.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        answered = time.monotonic()
        kept.sendall(head)  # the next request's head, never finished
        # The trickle first: a header line every half second until the server closes it.
        closed = {"trickle": closed_at(connections["trickle"], b"X-Pad: 1\r\n")}
        for name in ("silent", "half a head", "kept alive"):
            closed[name] = closed_at(connections[name])
    finally:
        for connection in connections.values():
            connection.close()
    for name, at in closed.items():
        since = answered if name == "kept alive" else started
        assert STALL_S - 0.5 <= at - since < STALL_S + 2, (name, at - since)
    assert metrics.slow_clients.value("request_head") == dropped + 4
    with local_server.client() as http:  # a whole request on a new connection: served
        assert http.get("/healthz").status_code == 200


def closed_at(connection: socket.socket, trickle: bytes = b"") -> float:
    """When the server closed ``connection`` (what it sends before is read and dropped),
    sending ``trickle`` every half second meanwhile."""
    connection.settimeout(0.5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if connection.recv(65536) == b"":
                return time.monotonic()
        except TimeoutError:
            if trickle:
                try:
                    connection.sendall(trickle)
                except OSError:
                    return time.monotonic()
        except ConnectionResetError:
            return time.monotonic()
    raise AssertionError("the server kept the connection open")


def stalled_request(url: str, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` (a request whose body is cut short) and wait: the status and body of
    the answer, which must come with the connection closed."""
    head, body = raw_exchange(url, data)
    return int(head[0].split(" ", 2)[1]), body


# -- container sessions: the live view and file uploads -----------------------------------


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()  # built once per machine (minutes); found in a moment otherwise
    with container_server(
        tmp_path_factory, "slow", ws_send_timeout_s=STALL_S, body_idle_timeout_s=STALL_S,
        vnc_viewer_buffer_bytes=4 * MIB, cdp_max_message_bytes=CDP_MESSAGE_CAP,
        cdp_client_buffer_bytes=CDP_CLIENT_BUFFER, cdp_session_buffer_bytes=CDP_SESSION_BUFFER,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def container_client(container: Server) -> Iterator[httpx.Client]:
    with container.client() as http:
        yield http


@pytest.fixture(scope="module")
def sandboxed(container_client: httpx.Client) -> Iterator[dict[str, Any]]:
    with open_session(container_client) as session:
        yield session


def view_url(client: httpx.Client, session: dict[str, Any]) -> str:
    response = client.post(f"/v1/sessions/{session['id']}/tokens", json={"scope": "view"})
    assert response.status_code == 201, response.text
    return f"{session['urls']['vnc_ws']}?token={response.json()['token']}"


class RawRfb:
    """The RFB handshake over a RawWebSocket, after which the viewer only sends."""

    def __init__(self, ws: RawWebSocket) -> None:
        self.ws = ws
        self._buffer = bytearray()
        assert self._read(12) == b"RFB 003.008\n"
        ws.send_binary(b"RFB 003.008\n")
        types = self._read(self._read(1)[0])
        assert 1 in types
        ws.send_binary(b"\x01")
        assert self._read(4) == b"\x00\x00\x00\x00"
        ws.send_binary(b"\x01")  # shared
        self.width, self.height = struct.unpack(">HH", self._read(4))
        self._read(16)
        self._read(struct.unpack(">I", self._read(4))[0])
        # 32-bit pixels, Raw encoding only: every frame is width*height*4 bytes.
        pixel_format = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 16, 8, 0)
        ws.send_binary(b"\x00\x00\x00\x00" + pixel_format)
        ws.send_binary(struct.pack(">BxHi", 2, 1, 0))

    def _read(self, size: int) -> bytes:
        while len(self._buffer) < size:
            data = self.ws.recv(timeout_s=20)
            assert isinstance(data, bytes)
            self._buffer += data
        out = bytes(self._buffer[:size])
        del self._buffer[:size]
        return out

    def ask_frames(self, count: int) -> None:
        request = struct.pack(">BBHHHH", 3, 0, 0, 0, self.width, self.height)
        for _ in range(count):
            self.ws.send_binary(request)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("requests", "why"), [(1, "takes nothing"), (40, "falls MiBs behind")],
)
def test_vnc_viewer_that_reads_nothing(
    container: Server, container_client: httpx.Client, sandboxed: dict[str, Any],
    requests: int, why: str,
) -> None:
    """One frame is 4,096,000 bytes: under the 4 MiB outbox, so the viewer that asked for
    one is dropped for taking nothing for STALL_S; the one that asked for 40 is dropped as
    soon as it is 4 MiB behind. Either way the other viewer keeps getting frames."""
    hub = container.services.vnc
    dropped = container.services.metrics.slow_clients.value("vnc")
    session_id = sandboxed["id"]
    url = view_url(container_client, sandboxed)
    with RfbViewer(url) as good:
        good.full_frame()
        rss_before = rss_bytes()
        with RawWebSocket(url, subprotocol="binary") as slow:
            RawRfb(slow).ask_frames(requests)
            assert hub.viewers(session_id) == 2
            for _ in range(4):
                started = time.monotonic()
                assert good.full_frame().shape == (DISPLAY["height"], DISPLAY["width"], 3)
                assert time.monotonic() - started < 10
            wait_for(lambda: hub.viewers(session_id) == 1, 30, f"a viewer that {why} dropped")
            rss_dropped = rss_bytes()
            _, closed = slow.drain(timeout_s=30)
            assert closed is not None
        for _ in range(2):
            good.full_frame()
        assert hub.viewers(session_id) == 1
    assert container.services.metrics.slow_clients.value("vnc") == dropped + 1
    # Our own socket holds a little; the proxy at most its 4 MiB outbox and a frame.
    assert rss_dropped - rss_before < 200 * MIB, (rss_before, rss_dropped)


def sandbox_processes(client: httpx.Client, session: dict[str, Any]) -> str:
    program = ("import os\n"
               "for p in os.listdir('/proc'):\n"
               "    if p.isdigit():\n"
               "        try: print(open(f'/proc/{p}/cmdline', 'rb').read())\n"
               "        except OSError: pass\n")
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["python3", "-c", program]})
    assert response.status_code == 200, response.text
    output: str = response.json()["stdout"]
    return output


@pytest.mark.slow
def test_uploads_that_stop_arriving(
    container: Server, container_client: httpx.Client, sandboxed: dict[str, Any]
) -> None:
    host, port = container.url.removeprefix("http://").split(":")
    path = f"/v1/sessions/{sandboxed['id']}/files"
    results: list[tuple[int, bytes]] = []

    def upload(n: int) -> None:
        head = (
            f"PUT {path}?path=/tmp/stalled-{n} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {KEY_A}\r\nContent-Type: application/octet-stream\r\n"
            "Content-Length: 10000000\r\n\r\n"
        ).encode()
        results.append(stalled_request(container.url, head + b"x" * 1000))

    started = time.monotonic()
    threads = [threading.Thread(target=upload, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # Answered and closed at once (uvicorn's keep-alive timeout would add 5 s).
    assert STALL_S - 0.5 <= time.monotonic() - started < STALL_S + 4
    assert len(results) == 3
    for status, body in results:
        assert status == 408, body
        assert json.loads(body)["error"]["type"] == "timeout"
    # The sandbox's writers are gone with their temporary files; nothing was written.
    assert b"deskbox-upload" not in sandbox_processes(container_client, sandboxed).encode()
    listing = container_client.post(f"/v1/sessions/{sandboxed['id']}/exec",
                                    json={"cmd": ["ls", "-a", "/tmp"]}).json()["stdout"]
    assert "stalled" not in listing and "deskbox-upload" not in listing, listing
    # And uploads work as before.
    response = container_client.put(path, params={"path": "/tmp/fine"}, content=b"abc")
    assert response.status_code == 200, response.text
    assert_error(container_client.put(path, params={"path": "tmp"}, content=b""), 422,
                 "invalid_request")


def start_download(server: Server, session: dict[str, Any], path: str) -> socket.socket:
    """A GET of ``path`` on a socket that then reads nothing (a small receive buffer)."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /v1/sessions/{session['id']}/files?path={path} HTTP/1.1\r\n"
                 f"Host: {host}\r\nAuthorization: Bearer {KEY_A}\r\n\r\n".encode())
    return sock


def received(sock: socket.socket) -> bytes:
    """Everything the server sends until it ends the connection."""
    sock.settimeout(20)
    data = bytearray()
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    return bytes(data)


def assert_cut(data: bytes, size: int) -> None:
    """An answer whose head says ``size`` bytes, and fewer came."""
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert f"content-length: {size}".encode() in head.lower(), head
    assert len(body) < size


def errors_logged(records: list[logging.LogRecord]) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.WARNING]


@pytest.mark.slow
def test_a_download_whose_client_reads_nothing_is_cut_and_frees_its_slot(
    container: Server, container_client: httpx.Client, sandboxed: dict[str, Any]
) -> None:
    """A client that stops reading a download (a response left open, unread): it held
    one of the session's transfer slots, and kept the session busy (never reaped when
    idle, never hibernated), for as long as it stayed connected. After ``ws_send_timeout_s``
    with nothing taken it is cut, and the slot and the session are free."""
    size = 32 * MIB
    run = container_client.post(f"/v1/sessions/{sandboxed['id']}/exec", json={
        "cmd": ["sh", "-c", f"head -c {size} /dev/urandom > /tmp/unread"]})
    assert run.status_code == 200 and run.json()["exit_code"] == 0, run.text
    handle = container.services.manager.handle(key_id(KEY_A), sandboxed["id"])
    live = container.services.manager.holding[sandboxed["id"]]
    dropped = container.services.metrics.slow_clients.value("download")
    with server_log() as records, start_download(container, sandboxed, "/tmp/unread") as sock:
        wait_for(lambda: handle.exec_slots.in_use == 1, 10, "the download started")
        wait_for(lambda: handle.exec_slots.in_use == 0 and live.busy == 0, STALL_S + 10,
                 "the slot given back")
        assert container.services.metrics.slow_clients.value("download") == dropped + 1
        assert_cut(received(sock), size)
    assert errors_logged(records) == []


@pytest.mark.slow
def test_a_download_cut_short_by_the_session_s_end_is_no_server_error(
    container: Server, container_client: httpx.Client
) -> None:
    """The session is deleted while its file streams: the client sees the download cut
    (its connection ends before the content-length), and the server logs it as what it
    is, not as an unhandled error with its traceback."""
    size = 32 * MIB
    with open_session(container_client) as session:
        run = container_client.post(f"/v1/sessions/{session['id']}/exec", json={
            "cmd": ["sh", "-c", f"head -c {size} /dev/urandom > /tmp/cut"]})
        assert run.status_code == 200 and run.json()["exit_code"] == 0, run.text
        handle = container.services.manager.handle(key_id(KEY_A), session["id"])
        with server_log() as records, start_download(container, session, "/tmp/cut") as sock:
            wait_for(lambda: handle.exec_slots.in_use == 1, 10, "the download started")
            assert container_client.delete(f"/v1/sessions/{session['id']}").status_code == 204
            assert_cut(received(sock), size)
    assert errors_logged(records) == []


# -- DevTools clients that never read, and a browser that floods them -----------------------

# Runs in the sandbox as its hostile tenant would: kills the session's Chromium, takes its
# DevTools port and answers like a browser. Every websocket gets FLOOD-byte text messages
# as fast as it takes them; /devtools/page/huge gets one message of argv[2] bytes.
FAKE_DEVTOOLS = r"""
import base64, hashlib, json, os, signal, socket, struct, sys, threading, time
flood, huge = int(sys.argv[1]), int(sys.argv[2])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
deadline = time.time() + 30
while True:
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if b'chromium' in open(f'/proc/{pid}/cmdline', 'rb').read():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    try:
        listener.bind(('127.0.0.1', 9222))
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.02)
listener.listen(64)

def frame(payload):
    n = len(payload)
    head = struct.pack('>BB', 0x81, n) if n < 126 else (
        struct.pack('>BBH', 0x81, 126, n) if n < 65536 else struct.pack('>BBQ', 0x81, 127, n))
    return head + payload

def serve(conn):
    try:
        head = b''
        while b'\r\n\r\n' not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        lines = head.decode('latin-1').split('\r\n')
        path = lines[0].split(' ')[1]
        pairs = (line.partition(':') for line in lines[1:])
        headers = {k.strip().lower(): v.strip() for k, _, v in pairs}
        if 'sec-websocket-key' not in headers:
            if path.startswith('/json/version'):
                body = json.dumps({'Browser': 'fake', 'webSocketDebuggerUrl':
                                   'ws://127.0.0.1:9222/devtools/browser/fake-0001'}).encode()
            else:
                body = b'[]'
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
                         b'Content-Length: %d\r\nConnection: close\r\n\r\n' % len(body) + body)
            return
        accept = base64.b64encode(hashlib.sha1(
            (headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()
        ).digest())
        conn.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n'
                     b'Connection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + b'\r\n\r\n')
        if path == '/devtools/page/huge':
            conn.sendall(frame(b'h' * huge))
            time.sleep(30)
            return
        message = frame(b'{"method":"flood","params":{"pad":"' + b'f' * flood + b'"}}')
        while True:
            conn.sendall(message)
    except OSError:
        pass
    finally:
        conn.close()

while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
CDP_MESSAGE_CAP = 16 * MIB  # cdp_max_message_bytes of the container server
CDP_CLIENT_BUFFER = 16 * MIB
CDP_SESSION_BUFFER = 32 * MIB
FLOOD = 8 * MIB


def take_devtools_port(client: httpx.Client, session: dict[str, Any]) -> None:
    """Start FAKE_DEVTOOLS in the session; return once the proxy reaches it."""
    files = f"/v1/sessions/{session['id']}/files"
    response = client.put(files, params={"path": "/tmp/fake_devtools.py"},
                          content=FAKE_DEVTOOLS.encode())
    assert response.status_code == 200, response.text
    response = client.post(f"/v1/sessions/{session['id']}/exec", json={
        "cmd": ["python3", "/tmp/fake_devtools.py", str(FLOOD), str(CDP_MESSAGE_CAP + 1)],
        "background": True,
    })
    assert response.status_code == 200, response.text

    def answers() -> bool:
        version = client.get(f"/v1/sessions/{session['id']}/cdp/json/version")
        return version.status_code == 200 and version.json().get("Browser") == "fake"

    wait_for(answers, 30, "the fake DevTools server")


def held_bytes() -> int:
    """RSS once the allocator has given back its free pages: what is really held (glibc
    keeps large freed blocks for reuse, so a past peak would stay in the RSS)."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


class PeakRss:
    """This process's highest RSS while the block runs (sampled every 20 ms)."""

    def __init__(self) -> None:
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_devtools_clients_that_read_nothing_from_a_flooding_browser(
    container: Server, container_client: httpx.Client
) -> None:
    """The review's attack: a fake DevTools server in the sandbox floods 4 CDP clients that
    never read (it grew the server by 1.4 GB). The relay reads the browser at once into
    each client's outbox; the session's outboxes hold at most CDP_SESSION_BUFFER together,
    so clients are closed (1008) as they fall behind, and the server's memory stays flat."""
    metrics = container.services.metrics
    with open_session(container_client) as attacker, open_session(container_client) as other:
        take_devtools_port(container_client, attacker)
        url = attacker["urls"]["cdp_ws"]
        shot = f"/v1/sessions/{other['id']}/screenshot"
        assert container_client.get(shot).status_code == 200
        dropped = metrics.slow_clients.value("cdp")
        rss_before = held_bytes()
        slow = [RawWebSocket(url, headers=AUTH) for _ in range(4)]
        try:
            with PeakRss() as peak:
                # Meanwhile the neighbour answers as usual.
                for _ in range(5):
                    started = time.monotonic()
                    assert container_client.get(shot).status_code == 200
                    assert time.monotonic() - started < 5
                wait_for(lambda: metrics.slow_clients.value("cdp") >= dropped + 4, 60,
                         "the four slow DevTools clients dropped")
            # Still connected, still reading nothing: their relays have ended (within the
            # browser's close timeout) and nothing is counted for them any more.
            relays = container.app.state.cdp_relays
            wait_for(lambda: attacker["id"] not in relays, 15, "the relays ended")
            print(f"\ncdp flood: RSS before {rss_before / MIB:.0f} MiB, peak "
                  f"{peak.peak / MIB:.0f} MiB, after the drops {held_bytes() / MIB:.0f} MiB")
            for ws in slow:  # their connections were aborted or closed (1008)
                _, closed = ws.drain(timeout_s=30)
                assert closed is not None, "the server kept a slow DevTools client"
                assert closed.code in (None, 1008), closed
        finally:
            for ws in slow:
                ws.close()
        # At the peak: the session's budget, and per connection the message being read
        # from the browser and the one being written, in their copies (frame bytes, text,
        # the encoded frame, the write buffer). Unbounded (before), the four clients held
        # more, for as long as they stayed connected, and 32 of them could stay.
        assert peak.peak - rss_before < CDP_SESSION_BUFFER + 4 * 5 * FLOOD + 32 * MIB, (
            rss_before, peak.peak)
        assert container_client.get(shot).status_code == 200
        # A client that reads gets the flood, whole messages, as fast as it takes them.
        with connect(url, additional_headers=AUTH, max_size=None, open_timeout=10) as good:
            for _ in range(5):
                message = json.loads(good.recv(timeout=20))
                assert message["method"] == "flood" and len(message["params"]["pad"]) == FLOOD


def page_socket(client: httpx.Client, session: dict[str, Any]) -> str:
    """The DevTools websocket of the session's page."""
    targets = client.get(f"/v1/sessions/{session['id']}/cdp/json/list").json()
    return str(next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"])


def evaluate_repeat(request_id: int, size: int) -> str:
    """A DevTools request whose answer carries a string of ``size`` bytes."""
    return json.dumps({"id": request_id, "method": "Runtime.evaluate", "params": {
        "expression": f"'x'.repeat({size})", "returnByValue": True}})


@pytest.mark.slow
def test_a_devtools_client_dropped_for_reading_nothing_is_aborted(
    container: Server, container_client: httpx.Client, sandboxed: dict[str, Any]
) -> None:
    """A client that asks for large answers and reads none is dropped with the first one
    still in its connection's write buffer; its connection is aborted, which frees it.
    Under uvloop (what `deskbox serve` and these servers run) the abort did nothing: the
    server kept the answer for as long as the client stayed, and handed it over whole
    whenever the client read."""
    metrics = container.services.metrics
    dropped = metrics.slow_clients.value("cdp")
    size = CDP_CLIENT_BUFFER * 3 // 4  # the second waiting and a third are over the buffer
    with RawWebSocket(page_socket(container_client, sandboxed), headers=AUTH) as ws:
        for request_id in range(3):
            ws.send_text(evaluate_repeat(request_id, size))
        wait_for(lambda: metrics.slow_clients.value("cdp") > dropped, 30,
                 "the client that reads nothing dropped")
        time.sleep(2)  # the close frame's second, then the abort
        messages, closed = ws.drain(timeout_s=30)
    assert closed is not None, "the server kept the connection"
    assert messages == [], [len(m) for m in messages]


@pytest.mark.slow
def test_devtools_clients_that_read_every_answer_are_never_behind(
    container: Server, container_client: httpx.Client, sandboxed: dict[str, Any]
) -> None:
    """Two clients of one session take turns asking for large answers (full-page
    screenshots) and read each at once. The last answer each had taken stayed counted
    until its next one, so the third put the session over its budget and a client that
    had read everything was closed (1008) as the one furthest behind."""
    metrics = container.services.metrics
    dropped = metrics.slow_clients.value("cdp")
    size = CDP_SESSION_BUFFER * 3 // 8  # three are over the session's budget
    url = page_socket(container_client, sandboxed)
    with connect(url, additional_headers=AUTH, max_size=None, open_timeout=10) as first, \
            connect(url, additional_headers=AUTH, max_size=None, open_timeout=10) as second:
        for request_id, ws in enumerate([first, second] * 3):
            ws.send(evaluate_repeat(request_id, size))
            answer = json.loads(ws.recv(timeout=30))
            assert answer["id"] == request_id
            assert len(answer["result"]["result"]["value"]) == size
    assert metrics.slow_clients.value("cdp") == dropped


@pytest.mark.slow
def test_a_devtools_message_over_the_cap_from_the_browser(
    container: Server, container_client: httpx.Client
) -> None:
    with open_session(container_client) as attacker:
        take_devtools_port(container_client, attacker)
        page = f"{attacker['urls']['cdp_ws']}/page/huge"
        with connect(page, additional_headers=AUTH, max_size=None, open_timeout=10) as ws:
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=20)
        assert ws.close_code == 1009, ws.close_code
        assert ws.close_reason and str(CDP_MESSAGE_CAP) in ws.close_reason
