"""The CDP proxy's parts without a browser: DevTools HTTP reads, URL rewriting, the event log."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from deskbox_server.agent.devtools import browser_path, connect_tcp, get_json, open_websocket
from deskbox_server.api.cdp import rewrite_targets, rewrite_version
from deskbox_server.errors import BrowserUnavailable
from deskbox_server.schemas.sessions import SessionState
from deskbox_server.sessions.events import EventLog

BASE = "ws://127.0.0.1:8765/v1/sessions/ses_1/cdp"


@asynccontextmanager
async def fake_devtools(answer: bytes) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server on the loopback that answers every request with ``answer``."""
    requests: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], requests
    finally:
        server.close()
        await server.wait_closed()


def http(status: str, body: bytes, length: bool = True) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
    if length:
        head += f"Content-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def test_get_json_reads_a_bounded_answer() -> None:
    body = json.dumps({"Browser": "Chrome/156"}).encode()
    async with fake_devtools(http("200 OK", body)) as (port, requests):
        assert await get_json(await connect_tcp(port), "/json/version", 1024) == {
            "Browser": "Chrome/156"
        }
    assert requests[0].startswith(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1:")
    async with fake_devtools(http("200 OK", body, length=False)) as (port, _):
        assert await get_json(await connect_tcp(port), "/json/version", 1024)


@pytest.mark.parametrize("answer", [
    http("200 OK", b"x" * 2048),                 # over the limit, announced
    http("200 OK", b"x" * 2048, length=False),   # over the limit, until EOF
    http("404 Not Found", b"{}"),
    http("200 OK", b"not json"),
    "HTTP/1.1 2\u00b20 OK\r\n\r\n".encode("latin-1"),  # digits by str.isdigit(), not ASCII
    b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}",
    b"SSH-2.0-OpenSSH\r\n\r\n",
])
async def test_get_json_refuses_what_a_browser_should_not_say(answer: bytes) -> None:
    async with fake_devtools(answer) as (port, _):
        with pytest.raises(BrowserUnavailable):
            await get_json(await connect_tcp(port), "/json/version", 1024)


async def test_nothing_listening_is_browser_unavailable() -> None:
    async with fake_devtools(b"") as (port, _):
        pass  # closed again: nothing listens on port now
    with pytest.raises(BrowserUnavailable) as refused:
        await connect_tcp(port)
    assert refused.value.status == 409


def test_urls_are_rewritten_to_the_control_plane() -> None:
    version = {"Browser": "Chrome/156", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/"
               "browser/8a4c"}
    assert rewrite_version(version, BASE, None) == {"Browser": "Chrome/156",
                                                   "webSocketDebuggerUrl": BASE}
    assert rewrite_version(version, BASE, "dbt_x")["webSocketDebuggerUrl"] == BASE + "?token=dbt_x"
    targets = [
        {"id": "AB12", "type": "page", "url": "about:blank",
         "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/page/AB12",
         "devtoolsFrontendUrl": "/devtools/inspector.html?ws=127.0.0.1:9222/devtools/page/AB12"},
        {"id": "odd", "type": "page", "webSocketDebuggerUrl": "ws://evil.example/x/../y"},
        "not a target",
    ]
    assert rewrite_targets(targets, BASE, "dbt_x") == [
        {"id": "AB12", "type": "page", "url": "about:blank",
         "webSocketDebuggerUrl": f"{BASE}/page/AB12?token=dbt_x"},
        {"id": "odd", "type": "page"},
    ]
    # A URL urlsplit raises ValueError on: a 500, and the browser's watch ended for good.
    assert rewrite_targets([{"id": "v6", "webSocketDebuggerUrl": "ws://[x/devtools/page/a"}],
                           BASE, None) == [{"id": "v6"}]
    with pytest.raises(BrowserUnavailable):
        rewrite_targets({"not": "a list"}, BASE, None)
    with pytest.raises(BrowserUnavailable):
        rewrite_version(["not", "an", "object"], BASE, None)


async def test_the_event_log_replays_then_follows_then_ends() -> None:
    log = EventLog()
    log.publish("s1", "state", state=SessionState.starting)
    seen: list[str] = []

    async def follow() -> None:
        async for event in log.follow("s1", heartbeat_s=0.05):
            seen.append("heartbeat" if event is None else event.type)

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.12)
    log.publish("s1", "browser_exited", reason="gone")
    log.publish("s1", "browser_restarted", browser_restarts=1)
    log.end("s1")
    await asyncio.wait_for(follower, 5)
    events = [e for e in seen if e != "heartbeat"]
    assert events == ["state", "browser_exited", "browser_restarted"]
    assert "heartbeat" in seen
    ids = [e.id for e in log.history("s1")]
    assert len(ids) == 3 and ids == sorted(set(ids)), ids
    assert [e.type async for e in log.follow("s1", after=ids[1])] == ["browser_restarted"]


async def test_event_ids_come_from_the_clock_so_a_later_server_numbers_above() -> None:
    """The next server process (a fresh log) gives ids above those of the one before it, as
    the clock moved between them: Last-Event-ID resumes a stream there
    (tests/api/test_container_restart.py does it across real processes)."""
    earlier = EventLog().publish("s1", "state", state=SessionState.running).id
    before = time.time_ns() // 1000
    later = EventLog().publish("s1", "state", state=SessionState.stopping).id
    assert earlier < later and before <= later, (earlier, before, later)


async def test_a_browser_path_no_url_parser_takes_is_browser_unavailable() -> None:
    body = json.dumps({"webSocketDebuggerUrl": "ws://[x/devtools/browser/a"}).encode()
    async with fake_devtools(http("200 OK", body)) as (port, _):
        with pytest.raises(BrowserUnavailable):
            await browser_path(lambda: connect_tcp(port))


async def test_a_websocket_redirected_by_the_browser_is_browser_unavailable() -> None:
    """The library cannot follow a redirect on our socket: its ValueError was a 500."""
    redirect = b"HTTP/1.1 302 Found\r\nLocation: ws://127.0.0.1:1/x\r\nContent-Length: 0\r\n\r\n"
    async with fake_devtools(redirect) as (port, _):
        with pytest.raises(BrowserUnavailable):
            await open_websocket(lambda: connect_tcp(port), "/devtools/page/a", 1 << 20)
