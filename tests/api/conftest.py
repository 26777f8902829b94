"""A real server (uvicorn in a thread, real sockets) and a few real desktops behind it.

One server and one event-page session serve the whole API suite: desktops cost CPU, and
the machine has two cores. Every fixture tears down what it started, whatever happens.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from deskbox_server.api.auth import key_id
from deskbox_server.api.deps import Services
from deskbox_server.app import create_app
from deskbox_server.engines.local.sandbox import LocalSandbox
from deskbox_server.errors import DesktopFailed
from deskbox_server.serve import protocol_options
from deskbox_server.sessions.desktop import AnyDesktop
from deskbox_server.settings import Settings

from ..cdp_page import CdpPage
from ..images import session_image

KEY_A = "test-key-a-0123456789"
KEY_B = "test-key-b-9876543210"
EVENTS_PAGE = (Path(__file__).parent.parent / "pages" / "events.html").as_uri()
DISPLAY = {"width": 1280, "height": 800}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the session image (minutes, once) before the sandboxed tests' timeouts start."""
    here = Path(__file__).parent
    if any(
        Path(str(item.fspath)).parent == here
        and Path(str(item.fspath)).name.startswith("test_container")
        for item in session.items
    ):
        session_image()


@dataclass
class Server:
    url: str
    app: FastAPI
    settings: Settings

    @property
    def services(self) -> Services:
        services = self.app.state.services
        assert isinstance(services, Services)
        return services

    def client(self, key: str | None = KEY_A) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def ws_url(self, session_id: str) -> str:
        return f"ws{self.url.removeprefix('http')}/v1/sessions/{session_id}/actions/ws"

    def handle(self, session_id: str, key: str = KEY_A) -> AnyDesktop:
        handle = self.services.manager.handle(key_id(key), session_id)
        assert isinstance(handle.sandbox, LocalSandbox)
        return handle


@contextmanager
def running_server(settings: Settings) -> Iterator[Server]:
    """uvicorn on a socket we bound (127.0.0.1, a free port), stopped however the test ends."""
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections of a socket whose proto
    # says TCP, and without it every request after the first on a kept-alive connection
    # waited out the client's delayed ACK (40 ms; uvicorn writes the head and the body
    # apart). `deskbox serve` binds through getaddrinfo, which names it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        **protocol_options(settings, app.state.services.metrics),  # as `deskbox serve`
        log_level="warning",
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive(), "the server thread died while starting"
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield Server(f"http://127.0.0.1:{port}", app, settings)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
        assert not thread.is_alive(), "the server did not shut down"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # The unisolated local backend: its browser's DevTools let tests read the page exactly.
    # test_container.py runs the default (container) backend on a server of its own.
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("state"),
        api_keys=[KEY_A, KEY_B],
        backends=["local"],
        default_backend="local",
        reaper_interval_s=0.2,
        max_sessions=6,
        max_sessions_per_key=4,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture(scope="session")
def session(server: Server, client: httpx.Client) -> Iterator[dict[str, Any]]:
    """One running session showing the event-recording page, shared by the action tests."""
    response = client.post(
        "/v1/sessions",
        json={
            "display": DISPLAY,
            "browser": {"start_url": EVENTS_PAGE},
            "labels": {"suite": "api"},
        },
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    try:
        yield body
    finally:
        client.delete(f"/v1/sessions/{body['id']}")


class EventPage:
    """The session's event page, read through the browser's DevTools (the local backend)."""

    def __init__(self, cdp: CdpPage) -> None:
        self.cdp = cdp

    def events(self, *types: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.cdp.evaluate("window.__events") or []
        return [e for e in events if not types or e["type"] in types]

    def clear(self) -> None:
        self.cdp.evaluate("window.__events.length = 0")

    def field_value(self) -> str:
        return str(self.cdp.evaluate("document.getElementById('field').value"))

    def wait_for(self, *types: str, count: int = 1, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.events(*types)) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return found

    def wait_value(self, expected: str, timeout_s: float = 5.0) -> str:
        deadline = time.monotonic() + timeout_s
        while (value := self.field_value()) != expected and time.monotonic() < deadline:
            time.sleep(0.01)
        return value


@pytest.fixture(scope="session")
def page(server: Server, session: dict[str, Any]) -> Iterator[EventPage]:
    devtools = server.handle(session["id"]).sandbox.devtools_url
    deadline = time.monotonic() + 10
    while True:
        try:
            cdp = CdpPage.first(devtools)
            break
        except DesktopFailed:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with cdp:
        cdp.wait_painted()
        yield EventPage(cdp)
