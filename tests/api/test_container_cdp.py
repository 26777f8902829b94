"""CDP through the control plane, with real Playwright, on a sandboxed (container) session.

The browser is the session's: Playwright (from PyPI, no browser download) connects over
CDP with ``connect_over_cdp(session.urls.cdp_http)``; scripts and pixel actions share it.
The page arrives as a ``data:`` URL (the sandbox has no network).
"""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from deskbox.pixels import screen_point
from deskbox_server.api.auth import key_id
from deskbox_server.engines.desktop_commands import DEVTOOLS_PORT
from deskbox_server.engines.runc.sandbox import RuncSandbox

from .conftest import KEY_A, Server
from .containers import container_server, open_session
from .helpers import assert_error, decode, near, token_for

pytestmark = pytest.mark.slow

MAX_MESSAGE = 1024 * 1024  # this server's cdp_max_message_bytes
DISPLAY = {"width": 1280, "height": 800}
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>cdp page</title><style>
html, body { margin: 0; background: #ffffff; }
#name { position: absolute; left: 40px; top: 40px; width: 300px; height: 40px; }
#go { position: absolute; left: 360px; top: 40px; width: 120px; height: 40px; }
#status { position: absolute; left: 40px; top: 120px; width: 400px; height: 200px;
          background: #ff0000; }
#target { position: absolute; left: 700px; top: 500px; width: 60px; height: 40px; }
#far { position: absolute; left: 900px; top: 1800px; width: 80px; height: 30px; }
</style></head><body>
<input id="name"><button id="go">Go</button><div id="status"></div>
<button id="target">T</button><button id="far">F</button>
<script>
  window.hits = [];
  addEventListener('click', (e) => hits.push(e.target.id), true);
  document.getElementById('go').addEventListener('click', () => {
    const ok = document.getElementById('name').value === 'deskbox';
    document.getElementById('status').style.background = ok ? '#00ff00' : '#0000ff';
  });
</script></body></html>"""
PAGE_URL = "data:text/html;base64," + base64.b64encode(PAGE.encode()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "cdp", cdp_max_message_bytes=MAX_MESSAGE) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    with open_session(client, browser={"start_url": PAGE_URL}) as body:
        yield body


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as running:
        yield running


@pytest.fixture
def browser(
    playwright: Playwright, client: httpx.Client, session: dict[str, Any]
) -> Iterator[Browser]:
    token = token_for(client, session["id"], "cdp")
    connected = playwright.chromium.connect_over_cdp(f"{session['urls']['cdp_http']}?token={token}")
    try:
        yield connected
    finally:
        connected.close()


def the_page(browser: Browser) -> Page:
    pages = [p for context in browser.contexts for p in context.pages if p.url == PAGE_URL]
    assert pages, [p.url for context in browser.contexts for p in context.pages]
    return pages[0]


def act(client: httpx.Client, session: dict[str, Any], body: dict[str, Any]) -> Any:
    response = client.post(f"/v1/sessions/{session['id']}/actions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def screenshot(client: httpx.Client, session: dict[str, Any]) -> Any:
    response = client.get(f"/v1/sessions/{session['id']}/screenshot", params={"format": "png"})
    assert response.status_code == 200
    return decode(response.content)


def wait_until(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


# -- discovery ----------------------------------------------------------------------------


def test_json_endpoints_answer_like_chromium_with_our_urls(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    base = f"/v1/sessions/{session['id']}/cdp"
    version = client.get(f"{base}/json/version")
    assert version.status_code == 200, version.text
    body = version.json()
    assert body["Browser"].startswith(("Chrome/", "HeadlessChrome/"))
    assert body["Protocol-Version"] == "1.3"
    assert body["webSocketDebuggerUrl"] == session["urls"]["cdp_ws"]
    # Playwright asks for /json/version/ (trailing slash) and keeps the query string.
    token = token_for(client, session["id"], "cdp")
    with httpx.Client(base_url=str(client.base_url)) as anonymous:
        carried = anonymous.get(f"{base}/json/version/", params={"token": token})
    assert carried.status_code == 200
    assert carried.json()["webSocketDebuggerUrl"] == f"{session['urls']['cdp_ws']}?token={token}"

    for path in ("/json/list", "/json", "/json/list/"):
        listing = client.get(base + path)
        assert listing.status_code == 200, (path, listing.text)
        pages = [t for t in listing.json() if t["type"] == "page"]
        assert [p["url"] for p in pages] == [PAGE_URL]
        assert pages[0]["webSocketDebuggerUrl"] == (
            f"{session['urls']['cdp_ws']}/page/{pages[0]['id']}"
        )
        assert "devtoolsFrontendUrl" not in pages[0]
        assert f":{DEVTOOLS_PORT}" not in listing.text


def test_page_socket_speaks_cdp(client: httpx.Client, session: dict[str, Any]) -> None:
    target = [t for t in client.get(f"/v1/sessions/{session['id']}/cdp/json/list").json()
              if t["type"] == "page"][0]
    with connect(target["webSocketDebuggerUrl"], compression=None, open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {KEY_A}"}) as ws:
        ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate",
                            "params": {"expression": "document.title", "returnByValue": True}}))
        reply = json.loads(ws.recv(timeout=10))
    assert reply["id"] == 1 and reply["result"]["result"]["value"] == "cdp page"


# -- auth ---------------------------------------------------------------------------------


def test_wrong_expired_and_other_scope_tokens_are_refused(
    client: httpx.Client, session: dict[str, Any], playwright: Playwright
) -> None:
    http = session["urls"]["cdp_http"]
    ws = session["urls"]["cdp_ws"]
    base = f"/v1/sessions/{session['id']}/cdp/json/version"
    expiring = token_for(client, session["id"], "cdp", ttl_s=1)
    view = token_for(client, session["id"], "view")
    revoked_response = client.post(f"/v1/sessions/{session['id']}/tokens", json={"scope": "cdp"})
    revoked = revoked_response.json()
    assert client.delete(
        f"/v1/sessions/{session['id']}/tokens/{revoked['id']}"
    ).status_code == 204
    time.sleep(1.2)
    with httpx.Client(base_url=str(client.base_url)) as anonymous:
        assert_error(anonymous.get(base), 401, "unauthorized")
        assert_error(anonymous.get(base, params={"token": "dbt_wrong"}), 401, "unauthorized")
        assert_error(anonymous.get(base, params={"token": expiring}), 401, "unauthorized")
        assert_error(anonymous.get(base, params={"token": revoked["token"]}), 401,
                     "unauthorized")
        assert_error(anonymous.get(base, params={"token": view}), 403, "forbidden")
        assert_error(anonymous.get(base, headers={"Authorization": "Bearer nope"}), 401,
                     "unauthorized")
    for query in ("", "?token=dbt_wrong", f"?token={expiring}", f"?token={view}"):
        with pytest.raises(InvalidStatus) as refused, connect(ws + query, open_timeout=10):
            pass
        assert refused.value.response.status_code in (401, 403)
    with pytest.raises(PlaywrightError):
        playwright.chromium.connect_over_cdp(f"{http}?token={expiring}", timeout=10_000)
    with pytest.raises(PlaywrightError):
        playwright.chromium.connect_over_cdp(http, timeout=10_000)


def test_api_key_as_bearer_header(playwright: Playwright, session: dict[str, Any]) -> None:
    browser = playwright.chromium.connect_over_cdp(
        session["urls"]["cdp_http"], headers={"Authorization": f"Bearer {KEY_A}"}
    )
    try:
        assert the_page(browser).title() == "cdp page"
    finally:
        browser.close()


# -- Playwright and pixels on one browser -------------------------------------------------


def test_playwright_fills_and_clicks_and_our_screenshot_shows_it(
    browser: Browser, client: httpx.Client, session: dict[str, Any]
) -> None:
    page = the_page(browser)
    status = screen_point(page, "#status")
    assert near(screenshot(client, session).getpixel(status), RED)
    page.fill("#name", "deskbox")
    page.click("#go")
    assert page.eval_on_selector("#status", "e => e.style.background") == "rgb(0, 255, 0)"

    def turned_green() -> Any:
        image = screenshot(client, session)
        return image if near(image.getpixel(status), GREEN) else None

    assert wait_until(turned_green)


@pytest.mark.parametrize("selector", ["#target", "#far", "#go"])
def test_a_pixel_click_at_the_mapped_point_hits_the_element(
    browser: Browser, client: httpx.Client, session: dict[str, Any], selector: str
) -> None:
    page = the_page(browser)
    page.evaluate("hits.length = 0")
    point = screen_point(page, selector)  # #far is below the fold: scrolled into view first
    act(client, session, {"type": "click", "x": point.x, "y": point.y})
    assert wait_until(lambda: page.evaluate("hits")) == [selector[1:]]


def test_pixel_mapping_follows_page_zoom_and_coordinate_spaces(
    browser: Browser, client: httpx.Client, session: dict[str, Any]
) -> None:
    page = the_page(browser)
    page.evaluate("window.scrollTo(0, 0)")
    try:
        act(client, session, {"actions": [{"type": "key", "keys": "ctrl+plus"},
                                          {"type": "key", "keys": "ctrl+plus"}]})
        wait_until(lambda: page.evaluate("devicePixelRatio") > 1.2)
        page.evaluate("hits.length = 0")
        point = screen_point(page, "#target")
        unzoomed = (700 + 30, 87 + 500 + 20)
        assert point.x > unzoomed[0] and point.y > unzoomed[1]  # zoom moved it right and down
        act(client, session, {"type": "click", "x": point.x, "y": point.y})
        assert wait_until(lambda: page.evaluate("hits")) == ["target"]

        page.evaluate("hits.length = 0")
        space = (640, 400)
        half = screen_point(page, page.locator("#target"), coordinate_space=space)
        act(client, session, {
            "actions": [{"type": "click", "x": half.x, "y": half.y}],
            "coordinate_space": {"width": space[0], "height": space[1]},
        })
        assert wait_until(lambda: page.evaluate("hits")) == ["target"]
    finally:
        act(client, session, {"type": "key", "keys": "ctrl+0"})
        wait_until(lambda: page.evaluate("devicePixelRatio") == 1)


def test_a_pixel_click_is_seen_by_playwright(
    browser: Browser, client: httpx.Client, session: dict[str, Any]
) -> None:
    page = the_page(browser)
    page.fill("#name", "")
    point = screen_point(page, "#name")
    act(client, session, {"actions": [{"type": "click", "x": point.x, "y": point.y},
                                      {"type": "type", "text": "typed by pixels ✓"}]})
    assert wait_until(lambda: page.input_value("#name") == "typed by pixels ✓")


def test_two_playwright_clients_at_once(
    playwright: Playwright, client: httpx.Client, session: dict[str, Any]
) -> None:
    first = playwright.chromium.connect_over_cdp(
        f"{session['urls']['cdp_http']}?token={token_for(client, session['id'], 'cdp')}")
    second = playwright.chromium.connect_over_cdp(
        session["urls"]["cdp_http"], headers={"Authorization": f"Bearer {KEY_A}"})
    try:
        the_page(first).evaluate("window.shared = 'from the first'")
        assert the_page(second).evaluate("window.shared") == "from the first"
        first.close()
        assert the_page(second).evaluate("document.title") == "cdp page"
    finally:
        second.close()


def test_closing_playwright_leaves_the_browser_running(
    playwright: Playwright, client: httpx.Client, session: dict[str, Any]
) -> None:
    before = client.get(f"/v1/sessions/{session['id']}/cdp/json/version").json()
    browser = playwright.chromium.connect_over_cdp(
        session["urls"]["cdp_http"], headers={"Authorization": f"Bearer {KEY_A}"})
    context = browser.new_context()  # Playwright's own context goes with the connection
    context.new_page().goto("about:blank")
    browser.close()
    after = client.get(f"/v1/sessions/{session['id']}/cdp/json/version")
    assert after.status_code == 200 and after.json() == before
    pages = [t for t in client.get(f"/v1/sessions/{session['id']}/cdp/json/list").json()
             if t["type"] == "page"]
    assert [p["url"] for p in pages] == [PAGE_URL]
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "running"


# -- limits and isolation -----------------------------------------------------------------


def test_messages_over_the_limit_close_the_socket(session: dict[str, Any]) -> None:
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with connect(session["urls"]["cdp_ws"], additional_headers=headers, max_size=None,
                 open_timeout=10) as ws:
        ws.send(json.dumps({"id": 1, "method": "Browser.getVersion",
                            "params": {"pad": "x" * MAX_MESSAGE}}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert ws.close_code == 1009
    target = [t for t in httpx.get(
        session["urls"]["cdp_http"] + "/json/list", headers=headers).json()
        if t["type"] == "page"][0]
    with connect(target["webSocketDebuggerUrl"], additional_headers=headers, max_size=None,
                 open_timeout=10) as ws:
        expression = f"'y'.repeat({MAX_MESSAGE + 1})"
        ws.send(json.dumps({"id": 1, "method": "Runtime.evaluate",
                            "params": {"expression": expression, "returnByValue": True}}))
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)
    assert ws.close_code == 1009


def _refused(port: int, address: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect((address, port))
        except OSError:
            return True
        # Something of the host's listens there: it must not be a session's browser.
        probe.sendall(b"GET /json/version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        return b"webSocketDebuggerUrl" not in probe.recv(65536)


def test_the_debugging_port_is_not_reachable_from_the_host(
    server: Server, client: httpx.Client, session: dict[str, Any]
) -> None:
    handle = server.services.manager.handle(key_id(KEY_A), session["id"])
    assert isinstance(handle.sandbox, RuncSandbox)
    # It listens inside the sandbox (that is how the proxy reaches it) ...
    assert client.get(f"/v1/sessions/{session['id']}/cdp/json/version").status_code == 200
    # ... and nowhere on the host, with egress none and with a pasta-connected namespace.
    assert _refused(DEVTOOLS_PORT)
    response = client.post("/v1/sessions", json={"display": {"width": 640, "height": 400},
                                                 "network": {"egress": "all"}})
    assert response.status_code == 201, response.text
    other = response.json()
    try:
        assert client.get(f"/v1/sessions/{other['id']}/cdp/json/version").status_code == 200
        addresses = {"127.0.0.1"} | {
            info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                      socket.AF_INET)
        }
        for address in sorted(addresses):
            assert _refused(DEVTOOLS_PORT, str(address)), address
    finally:
        client.delete(f"/v1/sessions/{other['id']}")


# -- the browser exits; the session restarts it ---------------------------------------------


def read_events(client: httpx.Client, session: dict[str, Any], count: int,
                timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """The first ``count`` events of the session's SSE stream."""
    events: list[dict[str, Any]] = []
    with client.stream("GET", f"/v1/sessions/{session['id']}/events",
                       timeout=timeout_s) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
                if len(events) >= count:
                    break
    return events


def test_a_closed_or_crashed_browser_is_restarted_and_reported(
    playwright: Playwright, client: httpx.Client, session: dict[str, Any]
) -> None:
    headers = {"Authorization": f"Bearer {KEY_A}"}
    browser = playwright.chromium.connect_over_cdp(session["urls"]["cdp_http"], headers=headers)
    disconnected: list[bool] = []
    browser.on("disconnected", lambda _: disconnected.append(True))
    with connect(session["urls"]["cdp_ws"], additional_headers=headers, open_timeout=10) as raw:
        browser.contexts[0].add_cookies([{
            "name": "kept", "value": "1", "url": "http://deskbox.test/",
            "expires": time.time() + 3600,
        }])
        browser.new_browser_cdp_session().send("Browser.close")  # closes the browser cleanly
        with pytest.raises(ConnectionClosed):
            raw.recv(timeout=15)
    assert raw.close_code == 1001 and raw.close_reason  # a clean close, with a reason


    def playwright_noticed() -> bool:  # a call lets the sync API dispatch its events
        try:
            browser.new_browser_cdp_session().detach()
        except PlaywrightError:
            return True
        return False

    wait_until(playwright_noticed, 15)
    assert disconnected == [True] and not browser.is_connected()
    events = read_events(client, session, 4)
    assert [e["type"] for e in events] == ["state", "state", "browser_exited",
                                           "browser_restarted"]
    assert events[1]["state"] == "running" and events[3]["browser_restarts"] == 1

    # The restarted browser: the same profile (the cookie), the start page again.
    again = playwright.chromium.connect_over_cdp(session["urls"]["cdp_http"], headers=headers)
    try:
        page = wait_until(lambda: [p for p in again.contexts[0].pages if p.url == PAGE_URL])[0]
        assert page.title() == "cdp page"
        cookies = again.contexts[0].cookies("http://deskbox.test/")
        assert [c["name"] for c in cookies] == ["kept"]
    finally:
        again.close()

    # A crash (SIGKILL) is restarted as well.
    kill = ("import json, os, signal; pids = json.load(open('/run/deskbox/status.json'))"
            "['pids']; os.kill(pids['browser'], signal.SIGKILL)")
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["python3", "-c", kill]})
    assert response.status_code == 200 and response.json()["exit_code"] == 0, response.text
    events = read_events(client, session, 6)
    assert [e["type"] for e in events[4:]] == ["browser_exited", "browser_restarted"]
    assert events[5]["browser_restarts"] == 2
    version = wait_until(lambda: (r := client.get(
        f"/v1/sessions/{session['id']}/cdp/json/version")).status_code == 200 and r)
    assert version.json()["webSocketDebuggerUrl"] == session["urls"]["cdp_ws"]
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "running"
