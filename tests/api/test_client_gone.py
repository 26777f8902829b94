"""A client that leaves is no fault of the server's: nothing is logged as an error nor
counted as an internal one.

- An upload whose client closes the connection with the body half sent: Starlette's
  ClientDisconnect reached the request's last handler, which logged "unhandled error" with
  a traceback and counted an `internal` error (alerts on internal errors fired).
- A DevTools socket refused (a wrong token) by a server that had accepted none yet: after
  the right 401, the clean-up read the relays table that the first accepted socket makes,
  and uvicorn logged "Exception in ASGI application", for every such socket.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deskbox_server.settings import Settings

from ..images import IMAGE_STATE_DIR, session_image
from .conftest import KEY_A, Server, running_server
from .helpers import server_log


def internal_errors(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    found = re.search(r'^deskbox_errors_total\{type="internal"\} ([0-9.e+-]+)$', text, re.M)
    return float(found[1]) if found else 0.0


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Any]]]:
    """A container-backend server (files need a sandbox) and a session of it."""
    session_image()
    settings = Settings(state_dir=tmp_path_factory.mktemp("gone-state"), api_keys=[KEY_A],
                        backends=["container"], default_backend="container",
                        image_state_dir=IMAGE_STATE_DIR)
    with running_server(settings) as running, running.client() as client:
        created = client.post("/v1/sessions", json={"timeout_s": 600})
        assert created.status_code == 201, created.text
        try:
            yield running, created.json()
        finally:
            client.delete(f"/v1/sessions/{created.json()['id']}")


def test_an_upload_whose_client_leaves_is_no_internal_error(
    box: tuple[Server, dict[str, Any]]
) -> None:
    server, session = box
    client = server.client()
    before = internal_errors(client)
    host, port = server.url.removeprefix("http://").split(":")
    with server_log() as said:
        with socket.create_connection((host, int(port))) as raw:
            raw.sendall(
                f"PUT /v1/sessions/{session['id']}/files?path=/tmp/gone.bin HTTP/1.1\r\n"
                f"Host: {host}\r\nAuthorization: Bearer {KEY_A}\r\n"
                "Content-Type: application/octet-stream\r\nContent-Length: 1000000\r\n\r\n"
                .encode() + b"x" * 300_000)
            time.sleep(0.5)  # the handler reads the body's first part
        deadline = time.monotonic() + 5
        while not any("/files" in r.getMessage() for r in said) and (
                time.monotonic() < deadline):
            time.sleep(0.1)  # what the handler says once it finds the client gone
    assert [r.getMessage() for r in said if r.levelno >= logging.ERROR] == []
    assert internal_errors(client) == before
    # The session goes on, and the half-written file is not left under its name.
    listed = client.post(f"/v1/sessions/{session['id']}/exec",
                         json={"cmd": ["ls", "/tmp"], "timeout_s": 10})
    assert listed.status_code == 200, listed.text
    assert "gone.bin" not in listed.json()["stdout"]
    client.close()


def test_a_refused_devtools_socket_on_a_fresh_server_logs_no_error(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                        default_backend="local")
    # uvicorn configures its loggers as the server starts: listened to after that.
    with running_server(settings) as fresh, server_log() as said:
        ws = fresh.url.replace("http://", "ws://")
        for _ in range(2):
            with pytest.raises(InvalidStatus) as refused:
                connect(f"{ws}/v1/sessions/ses_0123456789abcdef0123/cdp"
                        "?token=dbt_not-a-token-of-ours", open_timeout=10)
            assert refused.value.response.status_code == 401
        time.sleep(0.2)  # the handler's clean-up, after the denial was sent
    assert [r.getMessage() for r in said if r.levelno >= logging.ERROR] == []
