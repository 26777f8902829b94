"""CDP and the event stream on the unisolated local backend (the API suite's shared server)."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from deskbox_server.api.cdp import MAX_SOCKETS_PER_SESSION

from .conftest import KEY_A
from .helpers import assert_error


def test_openapi_lists_cdp_and_events(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/cdp/json/version", "/cdp/json/list", "/events"):
        assert "get" in paths[f"/v1/sessions/{{session_id}}{path}"], path


def test_playwright_on_a_local_session(client: httpx.Client, session: dict[str, Any]) -> None:
    version = client.get(f"/v1/sessions/{session['id']}/cdp/json/version")
    assert version.status_code == 200
    assert version.json()["webSocketDebuggerUrl"] == session["urls"]["cdp_ws"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(
            session["urls"]["cdp_http"], headers={"Authorization": f"Bearer {KEY_A}"})
        try:
            pages = [p for c in browser.contexts for p in c.pages]
            assert [p.title() for p in pages] == ["Deskbox event recorder"]
        finally:
            browser.close()
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "running"


def sse_events(client: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    """Every event of a stream that ends (the session has ended)."""
    with client.stream("GET", f"/v1/sessions/{session_id}/events", timeout=20) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: ")]


def test_a_token_of_another_session_and_the_event_stream(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    response = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert response.status_code == 201, response.text
    other = response.json()
    try:
        token = client.post(f"/v1/sessions/{other['id']}/tokens",
                            json={"scope": "cdp"}).json()["token"]
        with httpx.Client(base_url=str(client.base_url)) as anonymous:
            mine = anonymous.get(f"/v1/sessions/{other['id']}/cdp/json/version",
                                 params={"token": token})
            assert mine.status_code == 200
            foreign = anonymous.get(f"/v1/sessions/{session['id']}/cdp/json/version",
                                    params={"token": token})
            assert_error(foreign, 403, "forbidden")
    finally:
        assert client.delete(f"/v1/sessions/{other['id']}").status_code == 204
    events = sse_events(client, other["id"])
    assert [e["state"] for e in events] == ["starting", "running", "stopping", "stopped"]
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids)), ids  # increasing: a resumed stream sends those above
    assert all(e["type"] == "state" and e["session_id"] == other["id"] for e in events)
    assert_error(client.get("/v1/sessions/ses_never/events"), 404, "not_found")


def test_cdp_traffic_keeps_a_session_alive_and_sockets_are_capped(
    client: httpx.Client,
) -> None:
    response = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240},
                                                 "timeout_s": 2})
    assert response.status_code == 201, response.text
    other = response.json()
    headers = {"Authorization": f"Bearer {KEY_A}"}
    try:
        with ExitStack() as stack:
            sockets = [stack.enter_context(connect(other["urls"]["cdp_ws"], open_timeout=10,
                                                   additional_headers=headers))
                       for _ in range(MAX_SOCKETS_PER_SESSION)]
            with pytest.raises(InvalidStatus) as refused, connect(
                other["urls"]["cdp_ws"], open_timeout=10, additional_headers=headers
            ):
                pass
            assert refused.value.response.status_code == 429
            ws = sockets[0]
            deadline = time.monotonic() + 3.5  # well past the 2 s idle timeout
            while time.monotonic() < deadline:
                ws.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
                assert json.loads(ws.recv(timeout=10))["id"] == 1
                time.sleep(0.3)
            assert client.get(f"/v1/sessions/{other['id']}").json()["state"] == "running"
        # Idle now: the reaper stops it, as any idle session.
        deadline = time.monotonic() + 10
        while client.get(f"/v1/sessions/{other['id']}").json()["state"] == "running":
            assert time.monotonic() < deadline, "the idle session was not stopped"
            time.sleep(0.1)
    finally:
        client.delete(f"/v1/sessions/{other['id']}")


def test_a_message_larger_than_uvicorns_default_reaches_the_browser(
    session: dict[str, Any],
) -> None:
    """DevTools messages up to CDP_MAX_MESSAGE_BYTES (64 MiB) pass: uvicorn's own limit of
    16 MiB closed larger ones (a Playwright upload of 15 MB files disconnected the browser)."""
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with connect(session["urls"]["cdp_ws"], additional_headers=headers, max_size=None,
                 open_timeout=10) as ws:
        padding = "x" * (17 << 20)
        ws.send(json.dumps({"id": 7, "method": "Browser.getVersion",
                            "params": {"pad": padding}}))
        answer = json.loads(ws.recv(timeout=30))
    assert answer["id"] == 7 and answer["result"]["product"].startswith("Chrome/"), answer


def test_a_binary_frame_is_refused_with_its_reason(session: dict[str, Any]) -> None:
    """DevTools speaks JSON text: a binary frame closes the socket 1003 saying so (the
    browser hung up on it, and the client was told 1001, the browser had closed), and the
    next socket works."""
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with connect(session["urls"]["cdp_ws"], additional_headers=headers,
                 open_timeout=10) as ws:
        ws.send(b'{"id": 1, "method": "Browser.getVersion"}')
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert ws.close_code == 1003, (ws.close_code, ws.close_reason)
    assert ws.close_reason == "DevTools messages are JSON text; a binary frame is refused"
    with connect(session["urls"]["cdp_ws"], additional_headers=headers,
                 open_timeout=10) as again:
        again.send(json.dumps({"id": 2, "method": "Browser.getVersion"}))
        assert json.loads(again.recv(timeout=10))["id"] == 2


@pytest.mark.parametrize("path", ["/cdp/page/..%2F..%2Fjson", "/cdp/page/a/b", "/nothing"])
def test_a_websocket_to_no_endpoint_is_a_404_with_the_error_body(
    session: dict[str, Any], path: str,
) -> None:
    """Starlette refused a websocket no route takes with a bare 403: it read as a
    credentials problem, with no body to say otherwise."""
    url = session["urls"]["cdp_ws"] + path.removeprefix("/cdp")
    if path == "/nothing":
        url = session["urls"]["cdp_ws"].split("/v1/")[0] + "/v1/nothing"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, additional_headers={"Authorization": f"Bearer {KEY_A}"},
                open_timeout=10).close()
    response = refused.value.response
    assert response.status_code == 404, (response.status_code, response.body)
    error = json.loads(response.body)["error"]
    assert error["type"] == "not_found" and "no websocket endpoint at /v1/" in error["message"]
