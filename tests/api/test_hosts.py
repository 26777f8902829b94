"""DNS rebinding and foreign pages' websockets (api/hosts.py), against a real server.

A page of ``evil.example`` whose name its owner re-points at 127.0.0.1 reads the server as
its own origin, with ``Host: evil.example``: the server answered it, keyless routes
included (``/healthz``, ``/metrics``, ``/openapi.json``). And a page of any site may open a
websocket to any server: no websocket route looked at its ``Origin``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deskbox_server.errors import InvalidSetting
from deskbox_server.settings import Settings, load_settings

from .conftest import KEY_A, Server, running_server
from .helpers import assert_error, raw_exchange

KEYLESS = ["/healthz", "/metrics", "/openapi.json", "/"]
AUTH = {"Authorization": f"Bearer {KEY_A}"}


def port_of(server: Server) -> str:
    return server.url.rsplit(":", 1)[1]


@pytest.fixture(scope="module")
def listing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Listing names; and told to listen on a name (``--host``), which it then answers."""
    settings = Settings(state_dir=tmp_path_factory.mktemp("hosts"), api_keys=[KEY_A],
                        backends=["local"], default_backend="local", host="deskbox.internal",
                        allowed_hosts=["desk.example.org", ".corp.example"])
    with running_server(settings) as running:
        yield running


@pytest.mark.parametrize("path", KEYLESS)
@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example",
                                  "localhost.evil.example", "[::1", "127.0.0.1:x"])
def test_a_name_the_server_was_not_given_is_refused(server: Server, path: str,
                                                    host: str) -> None:
    with server.client(key=None) as client:
        response = client.get(path, headers={"Host": host.format(port=port_of(server))})
    error = assert_error(response, 403, "forbidden")
    assert "DESKBOX_ALLOWED_HOSTS" in error["message"], error


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "127.0.0.1", "localhost:{port}",
                                  "LocalHost.", "[::1]", "[::1]:{port}", "192.168.1.20:{port}"])
def test_addresses_and_localhost_are_answered(server: Server, host: str) -> None:
    with server.client(key=None) as client:
        response = client.get("/healthz", headers={"Host": host.format(port=port_of(server))})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("host", "status"), [
    ("desk.example.org", 200), ("DESK.example.org.:{port}", 200), ("corp.example", 200),
    ("a.b.corp.example:{port}", 200), ("deskbox.internal:{port}", 200), ("evil.example", 403),
    ("desk.example.org.evil.example", 403), ("evilcorp.example", 403),
])
def test_the_setting_lists_names_and_domains(listing_server: Server, host: str,
                                             status: int) -> None:
    with listing_server.client(key=None) as client:
        response = client.get("/healthz",
                              headers={"Host": host.format(port=port_of(listing_server))})
    assert response.status_code == status, response.text


def test_any_host_with_a_star(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", allowed_hosts=["*"])
    with running_server(settings) as running, running.client(key=None) as client:
        assert client.get("/healthz", headers={"Host": "anything.example"}).status_code == 200


def test_the_setting_refuses_what_is_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DESKBOX_ALLOWED_HOSTS", "desk.example.org, https://desk.example.org")
    with pytest.raises(InvalidSetting) as refused:
        load_settings()
    assert "DESKBOX_ALLOWED_HOSTS" in str(refused.value), refused.value
    monkeypatch.setenv("DESKBOX_ALLOWED_HOSTS", "Desk.Example.org., .corp.example,,*")
    assert load_settings().allowed_hosts == ["desk.example.org", ".corp.example", "*"]


@pytest.mark.parametrize(("host", "origin"), [
    ("evil.example:{port}", None), ("evil.example:{port}", "http://evil.example:{port}"),
    # The server's own address is no listed name: its pages open websockets to it alone.
    ("localhost:{port}", "http://127.0.0.1:{port}"),
])
def test_a_websocket_to_a_foreign_name_is_refused(server: Server, session: dict[str, Any],
                                                  host: str, origin: str | None) -> None:
    said = f"Origin: {origin}\r\n" if origin else ""
    request = (f"GET /v1/sessions/{session['id']}/actions/ws HTTP/1.1\r\n"
               f"Host: {host}\r\n{said}Authorization: Bearer {KEY_A}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
               "\r\n").format(port=port_of(server)).encode()
    lines, body = raw_exchange(server.url, request)
    assert lines[0].startswith("HTTP/1.1 403 "), lines
    assert json.loads(body)["error"]["type"] == "forbidden"


def refusal(url: str, origin: str) -> dict[str, Any]:
    with pytest.raises(InvalidStatus) as raised:
        connect(url, additional_headers={**AUTH, "Origin": origin}, open_timeout=10).close()
    response = raised.value.response
    assert response.status_code == 403, response
    error: dict[str, Any] = json.loads(response.body)["error"]
    assert error["type"] == "forbidden" and error["request_id"].startswith("req_"), error
    return error


@pytest.mark.parametrize("origin", ["http://evil.example", "https://evil.example:{port}",
                                    "http://127.0.0.1.evil.example:{port}", "null",
                                    "http://[::1", "http://localhost:{port}"])
def test_a_websocket_from_a_foreign_page_is_refused(server: Server, session: dict[str, Any],
                                                     origin: str) -> None:
    """``localhost`` is not ``127.0.0.1``: another origin, though its Host is allowed."""
    error = refusal(session["urls"]["actions_ws"], origin.format(port=port_of(server)))
    assert "DESKBOX_ALLOWED_HOSTS" in error["message"], error


@pytest.mark.parametrize("origin", [None, "http://127.0.0.1:{port}", "https://127.0.0.1",
                                    "HTTP://127.0.0.1.:{port}"])
def test_a_websocket_from_the_servers_own_page_or_no_page_is_taken(
    server: Server, session: dict[str, Any], origin: str | None
) -> None:
    """The view page and the console open their websockets from the server's own origin
    (a proxy in front may drop the port from Host: any port of the host passes); the SDK,
    the CLI and Playwright send no Origin."""
    with connect(session["urls"]["actions_ws"], additional_headers=AUTH, open_timeout=10,
                 origin=None if origin is None else origin.format(port=port_of(server)),
                 ) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "screen_size"}}))
        answer = json.loads(ws.recv(timeout=20))
    assert answer["ok"] and answer["result"] == {"width": 1280, "height": 800}, answer


def test_a_websocket_from_a_listed_page_is_taken(listing_server: Server) -> None:
    """Past the check, the route answers for itself: no such session here."""
    url = f"ws://127.0.0.1:{port_of(listing_server)}/v1/sessions/ses_none/actions/ws"
    for origin in ("https://console.corp.example", "https://desk.example.org"):
        with pytest.raises(InvalidStatus) as raised:
            connect(url, additional_headers={**AUTH, "Origin": origin}, open_timeout=10).close()
        assert raised.value.response.status_code == 404, raised.value.response
    refusal(url, "https://evil.example")


def test_a_websocket_with_a_star_still_checks_the_page(tmp_path: Path) -> None:
    """``*`` lets any Host in (a proxy in front checks names); a foreign page still cannot
    open a websocket to the server."""
    settings = Settings(state_dir=tmp_path, api_keys=[KEY_A], backends=["local"],
                        default_backend="local", allowed_hosts=["*"])
    with running_server(settings) as running:
        url = f"ws://127.0.0.1:{port_of(running)}/v1/sessions/ses_none/actions/ws"
        refusal(url, "https://evil.example")


def test_plain_requests_are_not_asked_for_an_origin(server: Server) -> None:
    """The browser's same-origin rule keeps a foreign page from reading them."""
    response = httpx.get(f"{server.url}/healthz", headers={"Origin": "https://evil.example"})
    assert response.status_code == 200, response.text
