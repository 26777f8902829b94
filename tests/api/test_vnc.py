"""The live view on the shared local-backend server: tokens, the RFB proxy and its filter.

A raw RFB viewer (tests/rfb_client.py) goes through ``WS /v1/sessions/{id}/vnc``; the
page's DevTools tell exactly what input reached it. The view page (vnc/) runs in a headless
Chromium.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from deskbox import Deskbox
from deskbox_server.api.tokens import TOKEN_ENDED
from deskbox_server.logs import RedactTokens
from deskbox_server.vnc import hub as vnc_hub

from ..cdp_page import CdpPage
from ..headless import canvas_pixel, headless_chromium
from ..rfb_client import RfbViewer
from .conftest import KEY_A, KEY_B, EventPage, Server
from .helpers import assert_error, issue_token, token_for

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def vnc_url(session: dict[str, Any], token: str) -> str:
    return f"{session['urls']['vnc_ws']}?token={token}"


@pytest.fixture(scope="module")
def origin(client: httpx.Client, session: dict[str, Any], page: EventPage) -> tuple[int, int]:
    page.clear()
    response = client.post(f"/v1/sessions/{session['id']}/actions",
                           json={"type": "click", "x": 640, "y": 700})
    assert response.status_code == 200, response.text
    click = page.wait_for("click")[0]
    page.clear()
    return click["screenX"] - click["clientX"], click["screenY"] - click["clientY"]


@pytest.fixture
def captured_log() -> Iterator[list[str]]:
    """Every log record of the server (this process's server-side loggers) during the test,
    formatted with its arguments and extra fields. The test's own HTTP clients log the URLs
    they open: those are the client's logs, not the server's."""
    lines: list[str] = []
    server_side = ("deskbox", "uvicorn", "fastapi", "starlette", "websockets.server")

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name.startswith(server_side):
                lines.append(self.format(record) + " " + repr(record.__dict__))

    handler = Keep(level=logging.DEBUG)
    handler.addFilter(RedactTokens())  # as configure_logging() installs it
    root = logging.getLogger()
    uvicorn = logging.getLogger("uvicorn.error")  # its "WebSocket /path?query" lines
    old_levels = root.level, uvicorn.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    uvicorn.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old_levels[0])
        uvicorn.setLevel(old_levels[1])


def refused(url: str, **kwargs: Any) -> int:
    """The HTTP status of a refused websocket upgrade (no RFB byte was ever sent)."""
    with pytest.raises(InvalidStatus) as info:
        with connect(url, open_timeout=10, **kwargs):
            pass
    return info.value.response.status_code


# -- tokens -------------------------------------------------------------------------------


def test_issue_and_revoke_a_token(client: httpx.Client, session: dict[str, Any]) -> None:
    body = issue_token(client, session["id"], "view", ttl_s=60)
    assert set(body) == {"id", "token", "scope", "session_id", "expires_at"}
    assert body["scope"] == "view" and body["session_id"] == session["id"]
    assert body["id"].startswith("tok_") and body["token"].startswith("dbt_")
    status = client.get(f"/v1/sessions/{session['id']}/view/status",
                        params={"token": body["token"]})
    assert status.status_code == 200 and status.json()["scope"] == "view"
    gone = client.delete(f"/v1/sessions/{session['id']}/tokens/{body['id']}")
    assert gone.status_code == 204
    assert_error(client.get(f"/v1/sessions/{session['id']}/view/status",
                            params={"token": body["token"]}), 401, "unauthorized")
    assert_error(client.delete(f"/v1/sessions/{session['id']}/tokens/{body['id']}"),
                 404, "not_found")


def test_an_ended_sessions_tokens_are_forgotten(client: httpx.Client, server: Server) -> None:
    """They stayed until they expired (up to a week), counting against the server's bound
    of live tokens: one key churning sessions filled it, and every key's next token was
    a 429 for days."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    held = len(server.services.tokens)
    for scope in ("view", "control", "cdp"):
        issue_token(client, sid, scope, ttl_s=7 * 24 * 3600)
    assert len(server.services.tokens) == held + 3
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert len(server.services.tokens) == held


def _closed_within(ws: Any, seconds: float) -> int | None:
    """The close code once the server closed ``ws`` (reading what it sends meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ws.recv(timeout=0.2)
        except TimeoutError:
            continue
        except ConnectionClosed:
            code: int | None = ws.close_code
            return code
    return None


def test_a_revoked_or_expired_token_ends_the_connections_it_opened(
    client: httpx.Client, session: dict[str, Any],
) -> None:
    """A token is checked when a viewer or DevTools client connects, and again while it
    stays connected: revoked or expired, the connection is closed (1008). They used to go
    on, and a revoked control token kept driving the desktop."""
    control = issue_token(client, session["id"], "control")
    with RfbViewer(vnc_url(session, control["token"])) as viewer:
        viewer.request(incremental=True)
        gone = client.delete(f"/v1/sessions/{session['id']}/tokens/{control['id']}")
        assert gone.status_code == 204
        assert _closed_within(viewer.ws, 5) == 1008
    cdp = issue_token(client, session["id"], "cdp", ttl_s=2)
    with connect(session["urls"]["cdp_ws"] + "?token=" + cdp["token"], open_timeout=10) as ws:
        ws.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
        assert json.loads(ws.recv(timeout=10))["id"] == 1
        assert _closed_within(ws, 6) == 1008  # its ttl of 2 s ran out
        assert ws.close_reason == TOKEN_ENDED
    # An API key's connection is not a token's: it stays.
    with connect(session["urls"]["cdp_ws"], open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {KEY_A}"}) as ws:
        assert _closed_within(ws, 2.5) is None


def test_token_requests_are_validated(
    server: Server, client: httpx.Client, session: dict[str, Any]
) -> None:
    path = f"/v1/sessions/{session['id']}/tokens"
    assert_error(client.post(path, json={"scope": "admin"}), 422, "invalid_request")
    assert_error(client.post(path, json={"scope": "view", "ttl_s": 0}), 422, "invalid_request")
    with server.client(KEY_B) as other:  # another key does not see the session
        assert_error(other.post(path, json={"scope": "view"}), 404, "not_found")
    with server.client(None) as anonymous:
        assert_error(anonymous.post(path, json={"scope": "view"}), 401, "unauthorized")


def test_bad_tokens_are_refused_before_any_rfb_byte(
    server: Server, client: httpx.Client, session: dict[str, Any]
) -> None:
    sid = session["id"]
    # another session of the same key
    other = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240},
                                              "browser": {"start_url": "about:blank"}})
    assert other.status_code == 201, other.text
    try:
        foreign = token_for(client, other.json()["id"], "control")
        assert refused(vnc_url(session, foreign)) == 403
    finally:
        client.delete(f"/v1/sessions/{other.json()['id']}")
    assert refused(vnc_url(session, token_for(client, sid, "cdp"))) == 403
    expired = token_for(client, sid, "control", ttl_s=1)
    revoked = issue_token(client, sid, "control")
    client.delete(f"/v1/sessions/{sid}/tokens/{revoked['id']}")
    assert refused(vnc_url(session, revoked["token"])) == 401
    assert refused(vnc_url(session, "dbt_" + "x" * 43)) == 401
    assert refused(vnc_url(session, KEY_A)) == 401  # API keys only in the header
    assert refused(session["urls"]["vnc_ws"]) == 401
    time.sleep(1.1)
    assert refused(vnc_url(session, expired)) == 401
    assert refused(session["urls"]["vnc_ws"],
                   additional_headers={"Authorization": f"Bearer {KEY_B}"}) == 404
    assert server.services.vnc.viewers(sid) == 0


# -- the proxy ----------------------------------------------------------------------------


def test_control_viewer_sees_the_page_and_clicks(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    ox, oy = origin
    token = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, token)) as viewer:
        assert (viewer.width, viewer.height) == (1280, 800)
        frame = viewer.full_frame()
        assert tuple(frame[oy + 150, ox + 200]) == RED
        assert tuple(frame[oy + 150, ox + 500]) == GREEN
        assert tuple(frame[oy + 350, ox + 200]) == BLUE
        page.clear()
        viewer.click(ox + 150, oy + 150)
        clicks = page.wait_for("click")
    assert clicks and (clicks[0]["clientX"], clicks[0]["clientY"]) == (150, 150)


def test_view_token_input_is_dropped(
    server: Server, client: httpx.Client, session: dict[str, Any], page: EventPage,
    origin: tuple[int, int],
) -> None:
    ox, oy = origin
    token = token_for(client, session["id"], "view")
    page.clear()
    with RfbViewer(vnc_url(session, token)) as viewer:
        # A modified client: pointer, keys and cut text straight onto the wire.
        viewer.click(ox + 150, oy + 150)
        viewer.pointer(ox + 800, oy + 400, 4)
        viewer.key(0x61, True)
        viewer.key(0x61, False)
        viewer.cut_text_to_server(b"from a viewer")
        frame = viewer.full_frame()  # the connection is still served...
        assert tuple(frame[oy + 150, ox + 200]) == RED
    time.sleep(0.5)
    assert page.events("mousedown", "mouseup", "click", "keydown", "wheel") == []
    # ...and the same bytes from a control viewer do land (the test can see a click).
    control = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, control)) as viewer:
        viewer.click(ox + 150, oy + 150)
        assert page.wait_for("click")


def test_a_viewer_that_leaves_holding_a_key_and_a_button_lets_go_of_them(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int],
) -> None:
    """A control viewer gone with Shift and the left button down: they are released, so
    that the agent's keys and clicks come out as sent (its typing came out in capitals and
    its click as a release only)."""
    ox, oy = origin
    token = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, token)) as viewer:
        viewer.key(0xFFE1, True)  # Shift_L
        viewer.pointer(ox + 150, oy + 150, 1)
        viewer.full_frame()  # both reached the server before the viewer goes
    time.sleep(1.0)  # the proxy lets go of them as the viewer leaves, before x11vnc stops
    page.clear()
    pressed = client.post(f"/v1/sessions/{session['id']}/actions",
                          json={"type": "key", "keys": "a"})
    assert pressed.status_code == 200, pressed.text
    clicked = client.post(f"/v1/sessions/{session['id']}/actions",
                          json={"type": "click", "x": 150, "y": 150})
    assert clicked.status_code == 200, clicked.text
    assert [(e["key"], e["shift"]) for e in page.wait_for("keydown")] == [("a", False)]
    assert [e["type"] for e in page.wait_for("click")] == ["click"]
    assert [e["type"] for e in page.events("mousedown", "mouseup", "click")] == [
        "mousedown", "mouseup", "click"]


def test_unknown_client_message_closes(client: httpx.Client, session: dict[str, Any]) -> None:
    token = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, token)) as viewer:
        viewer.send_raw(b"\xff\x00\x00\x00")  # QEMU client message: never announced
        with pytest.raises(ConnectionClosed) as info:
            for _ in range(100):
                viewer.ws.recv(timeout=10)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        assert info.value.rcvd.reason == "refused: unknown client message type 255"


def test_a_viewer_of_a_session_that_ends_is_told_so(client: httpx.Client) -> None:
    """The session's end closes its viewers 1001 with a reason: 1011 ("internal error")
    read as a bug of the server's."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    ending = created.json()
    token = token_for(client, ending["id"], "view")
    with RfbViewer(vnc_url(ending, token)) as viewer:
        viewer.full_frame()
        assert client.delete(f"/v1/sessions/{ending['id']}").status_code == 204
        assert _closed_within(viewer.ws, 10) == 1001
        assert viewer.ws.close_reason.startswith("the session's screen ended: it stopped")


def test_the_view_status_of_a_session_that_ended_says_so(client: httpx.Client) -> None:
    """The view page polls its status once the session's end closed its picture (1001): a
    view token's answer was a 401 once the server had forgotten the session's tokens, and
    the page said "access refused" of a session that had simply ended. It is the 404 of an
    ended session, naming its end; an API key still reads the session's final state."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    view, control = token_for(client, sid, "view"), token_for(client, sid, "control")
    status = f"/v1/sessions/{sid}/view/status"
    with httpx.Client(base_url=str(client.base_url), timeout=30) as anonymous:
        assert anonymous.get(status, params={"token": view}).json()["state"] == "running"
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        for token in (view, control):
            ended = assert_error(anonymous.get(status, params={"token": token}), 404,
                                 "not_found")
            assert ended["message"] == f"session {sid} ended (stopped)"
        assert_error(anonymous.get(f"/v1/sessions/{sid}/view", params={"token": view}), 404,
                     "not_found")
        assert refused(f"{created.json()['urls']['vnc_ws']}?token={view}") == 404
    assert client.get(status).json()["state"] == "stopped"


def test_many_viewers_share_one_server_that_stops_with_the_last(
    server: Server, client: httpx.Client, session: dict[str, Any], page: EventPage,
    origin: tuple[int, int],
) -> None:
    ox, oy = origin
    hub = server.services.vnc
    token = token_for(client, session["id"], "view")
    with RfbViewer(vnc_url(session, token)) as one, RfbViewer(vnc_url(session, token)) as two:
        assert hub.viewers(session["id"]) == 2
        first = hub.server(session["id"])
        assert first is not None and first.failure() is None
        one.full_frame()
        two.full_frame()
        page.clear()
        response = client.post(f"/v1/sessions/{session['id']}/actions",
                               json={"type": "click", "x": ox + 500, "y": oy + 450})
        assert response.status_code == 200
        assert page.wait_for("click")
        for viewer in (one, two):
            assert np.array_equal(viewer.full_frame()[oy + 150, ox + 200], RED)
    deadline = time.monotonic() + 5
    while hub.server(session["id"]) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hub.viewers(session["id"]) == 0 and hub.server(session["id"]) is None
    assert first.failure() == "the VNC server was stopped"


def test_view_page_is_served(client: httpx.Client, session: dict[str, Any]) -> None:
    token = token_for(client, session["id"], "view")
    view = session["urls"]["view"]
    response = httpx.get(view, params={"token": token})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert token not in response.text
    assert "/vnc/static/view.js" in response.text
    assert f'data-session="{session["id"]}"' in response.text and "$" not in response.text
    base = view.split("/v1/")[0]
    # The package's own files (vnc/): a browser runs module scripts only with a JS type.
    for asset in ("/vnc/static/view.js", "/vnc/static/live.js", "/vnc/novnc/core/rfb.js",
                  "/vnc/novnc/vendor/pako/lib/zlib/inflate.js"):
        served = httpx.get(base + asset)
        assert served.status_code == 200, asset
        assert served.headers["content-type"].startswith("text/javascript"), asset
    assert httpx.get(base + "/vnc/static/view.css").status_code == 200
    assert_error(httpx.get(view, params={"token": "dbt_" + "x" * 43}), 401, "unauthorized")
    # Without a token, the page alone (a reload: the page took the token out of its URL and
    # its tab kept it); it opens nothing by itself: each of its calls needs the token.
    alone = httpx.get(view)
    assert alone.status_code == 200 and alone.text == response.text
    assert_error(httpx.get(view + "/status"), 401, "unauthorized")


@pytest.mark.slow
def test_view_page_in_chromium_draws_the_desktop_and_shares_the_clipboard(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    """The page as a person opens it: a control link in a real Chromium, with noVNC of vnc/."""
    ox, oy = origin
    link = f"{session['urls']['view']}?token={token_for(client, session['id'], 'control')}"
    with headless_chromium(tmp_path / "viewer") as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        assert canvas_pixel(cdp, ox + 200, oy + 150, RED) == list(RED)
        assert canvas_pixel(cdp, ox + 500, oy + 150, GREEN) == list(GREEN)
        assert canvas_pixel(cdp, ox + 200, oy + 350, BLUE) == list(BLUE)
        shown = cdp.evaluate("""[document.getElementById('state').textContent,
            document.getElementById('scope').textContent,
            document.getElementById('clip-send').hidden, window.__deskbox.rfb.viewOnly,
            document.querySelector('#screen canvas').width]""")
        assert shown == ["connected", "control", False, False, 1280]
        # What the session copies shows in the clipboard panel, whole (RFB's cut text says
        # it changed, in Latin-1: "✓ 中" as "? ?"; the page then asks the server; x11vnc may
        # drop the first change after a viewer came: the owner's write is repeated a
        # second later)...
        actions(client, session, {"type": "clipboard_set", "text": "to thé page ✓ 中"})
        cdp.evaluate("document.getElementById('clip-toggle').click()")
        deadline = time.monotonic() + 5
        while cdp.evaluate("document.getElementById('clip-text').value") != "to thé page ✓ 中":
            assert time.monotonic() < deadline, "the clipboard never reached the page"
            time.sleep(0.05)
        assert cdp.evaluate("document.getElementById('clip').hidden") is False
        # ...and what the viewer pastes reaches the session's clipboard, whole.
        cdp.evaluate("""(() => { document.getElementById('clip-text').value = 'fróm ✓ 中';
            document.getElementById('clip-send').click(); })()""")
        deadline = time.monotonic() + 5
        while (got := actions(client, session, {"type": "clipboard_get"})[0]["text"]) != (
            "fróm ✓ 中"
        ):
            assert time.monotonic() < deadline, got
            time.sleep(0.05)
        assert cdp.evaluate("document.getElementById('clip-status').textContent") == "pasted"


@pytest.mark.slow
def test_view_page_in_chromium_with_a_view_token(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    token = token_for(client, session['id'], 'view')
    link = f"{session['urls']['view']}?token={token}"
    with headless_chromium(tmp_path / "viewer") as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        assert canvas_pixel(cdp, ox + 200, oy + 350, BLUE) == list(BLUE)
        shown = cdp.evaluate("""[document.getElementById('scope').textContent,
            document.getElementById('clip-send').hidden, window.__deskbox.rfb.viewOnly]""")
        assert shown == ["view only", True, True]
        # The token left the address bar (and so the history) at once; a reload still works.
        assert cdp.evaluate("location.href") == session["urls"]["view"]
        assert token not in cdp.evaluate("JSON.stringify(history.state) + location.href")
        cdp.evaluate("location.reload()")
        deadline = time.monotonic() + 20
        while cdp.evaluate("document.getElementById('state')?.textContent ?? ''") != "connected":
            assert time.monotonic() < deadline, "the reloaded page never connected"
            time.sleep(0.05)
        assert canvas_pixel(cdp, ox + 200, oy + 350, BLUE) == list(BLUE)


def _page_says(cdp: CdpPage, element: str, wanted: str) -> list[str]:
    """What the view page's ``element`` said, in order, until it says ``wanted`` (20 s)."""
    said: list[str] = []
    deadline = time.monotonic() + 20
    while not said or said[-1] != wanted:
        text = cdp.evaluate(f"document.getElementById('{element}')?.textContent ?? null")
        if text is not None and (not said or said[-1] != text):
            said.append(text)
        assert time.monotonic() < deadline, said
        time.sleep(0.05)
    return said


@pytest.mark.slow
def test_view_page_in_chromium_says_who_is_in_control_and_that_the_session_ended(
    tmp_path: Path, client: httpx.Client,
) -> None:
    """A view link's page said "you are in control" when a human took control elsewhere,
    and "access refused" once its session ended (its token was a 401 by then)."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    ending = created.json()
    sid = ending["id"]
    link = f"{ending['urls']['view']}?token={token_for(client, sid, 'view')}"
    with headless_chromium(tmp_path / "viewer") as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        _page_says(cdp, "state", "connected")
        assert client.post(f"/v1/sessions/{sid}/control").status_code == 200
        _page_says(cdp, "help", "a human is in control: the agent waits")
        assert cdp.evaluate("[document.getElementById('take').hidden, "
                            "document.getElementById('hand-back').hidden]") == [True, True]
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        said = _page_says(cdp, "state", "ended")
        assert not [text for text in said if "refused" in text], said


def _click_and_type_in_the_view(cdp: CdpPage, x: int, y: int, text: str,
                                focused: Callable[[], bool]) -> None:
    """A person's click at desktop pixel (x, y) of the live view's canvas, then, once
    ``focused`` says the click gave the field the focus (as a person sees the caret), keys."""
    box = cdp.evaluate("""(() => { const c = document.querySelector('#screen canvas');
        const r = c.getBoundingClientRect();
        return [r.left, r.top, r.width / c.width, r.height / c.height]; })()""")
    left, top, sx, sy = box
    at = {"x": left + x * sx, "y": top + y * sy, "button": "left", "clickCount": 1}
    for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
        cdp.call("Input.dispatchMouseEvent", {"type": kind, **at})
    deadline = time.monotonic() + 5
    while not focused():
        assert time.monotonic() < deadline, "the click did not reach the field"
        time.sleep(0.02)
    for char in text:
        key = {"key": char, "text": char, "code": f"Key{char.upper()}",
               "windowsVirtualKeyCode": ord(char.upper())}
        cdp.call("Input.dispatchKeyEvent", {"type": "keyDown", **key})
        cdp.call("Input.dispatchKeyEvent", {"type": "keyUp", **key})


@pytest.mark.slow
def test_a_human_takes_control_in_the_view_and_hands_back(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], page: EventPage,
    origin: tuple[int, int],
) -> None:
    """The agent asks for help; a person with a control link presses "Take control" in the
    real page; the agent's actions are refused (screenshots still work); the person's
    click, keys and the text the panel types (and pastes) land in the page and in the
    session's recording; "Hand back" gives the
    agent the desktop again; the event stream tells each step."""
    ox, oy = origin
    sid = session["id"]
    control = issue_token(client, sid, "control")
    link = f"{session['urls']['view']}?token={control['token']}"
    assert client.post(f"/v1/sessions/{sid}/recording/start").status_code == 200
    field = {"x": ox + 900, "y": oy + 175}
    asked = client.post(f"/v1/sessions/{sid}/handoff", json={"reason": "a captcha"})
    assert asked.status_code == 200 and asked.json()["needs_help"] is True, asked.text
    try:
        with headless_chromium(tmp_path / "viewer") as devtools, CdpPage.first(devtools) as cdp:
            cdp.navigate(link)
            assert canvas_pixel(cdp, ox + 200, oy + 150, RED) == list(RED)
            assert cdp.evaluate("document.getElementById('help').textContent") == (
                "the agent asks for help: a captcha")
            cdp.evaluate("document.getElementById('take').click()")
            deadline = time.monotonic() + 5
            while not client.get(f"/v1/sessions/{sid}/handoff").json()["human_in_control"]:
                assert time.monotonic() < deadline, "the page did not take control"
                time.sleep(0.05)
            refused = client.post(f"/v1/sessions/{sid}/actions",
                                  json={"type": "click", **field})
            assert_error(refused, 409, "human_in_control")
            looked = client.post(f"/v1/sessions/{sid}/actions", json={
                "actions": [{"type": "cursor_position"}], "screenshot": {"format": "png"}})
            assert looked.status_code == 200, looked.text
            assert client.get(f"/v1/sessions/{sid}/handoff").json()["needs_help"] is False
            page.cdp.evaluate("document.getElementById('field').value = ''; "
                              "document.activeElement.blur()")
            _click_and_type_in_the_view(
                cdp, field["x"], field["y"], "human", lambda: page.cdp.evaluate(
                    "document.activeElement && document.activeElement.id") == "field")
            assert page.wait_value("human") == "human"
            # Text composed with an input method never reaches the canvas as keys: the
            # person writes it in the clipboard panel and presses "Type into the session".
            cdp.evaluate("""(() => { document.getElementById('clip-toggle').click();
                document.getElementById('clip-text').value = ' 日本語 ✓';
                document.getElementById('clip-type').click(); })()""")
            assert page.wait_value("human 日本語 ✓") == "human 日本語 ✓"
            deadline = time.monotonic() + 5
            while cdp.evaluate("document.getElementById('clip-status').textContent") != "typed":
                assert time.monotonic() < deadline, "the page never said it typed"
                time.sleep(0.05)
            cdp.evaluate("document.getElementById('clip-send').click()")
            deadline = time.monotonic() + 5
            while cdp.evaluate("document.getElementById('clip-status').textContent") != (
                    "pasted"):
                assert time.monotonic() < deadline, "the page never said it pasted"
                time.sleep(0.05)
            # An agent waiting for the human (the SDK's long poll) is answered by the
            # hand-back.
            with ThreadPoolExecutor(1) as pool, Deskbox(str(client.base_url), KEY_A) as box:
                agent = box.sessions.get(sid)
                waiting = pool.submit(agent.wait_for_human, "still stuck", timeout_s=20)
                time.sleep(0.5)
                assert not waiting.done()
                cdp.evaluate("document.getElementById('hand-back').click()")
                answer = waiting.result(timeout=10)
            assert answer["human_in_control"] is False and answer["handed_back_at"]
            deadline = time.monotonic() + 5  # the page shows the answer to its own call
            while cdp.evaluate("document.getElementById('take').hidden") is not False:
                assert time.monotonic() < deadline, "the page still offers no Take control"
                time.sleep(0.05)
        again = client.post(f"/v1/sessions/{sid}/actions", json={"type": "cursor_position"})
        assert again.status_code == 200
        seen: list[str] = []
        with client.stream("GET", f"/v1/sessions/{sid}/events", timeout=5) as stream:
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    seen.append(line.removeprefix("event: "))
                if seen[-2:] == ["help_requested", "human_handed_back"]:
                    break
        assert seen[-4:] == ["help_requested", "human_took_control", "help_requested",
                             "human_handed_back"], seen
        client.post(f"/v1/sessions/{sid}/recording/stop")
        entries = [json.loads(line) for line in
                   client.get(f"/v1/sessions/{sid}/trajectory").text.splitlines()]
        steps = [(e["source"]["type"], e["action"]["type"], e.get("error", {}).get("type"))
                 for e in entries if e["kind"] == "action"]
        assert ("api_key", "click", "human_in_control") in steps, steps
        # The keys' "type" is written when the viewer leaves (it may go on), after the
        # panel's: in the order they began.
        human = sorted((e for e in entries if e["kind"] == "action" and e["source"] == {
            "type": "token", "id": control["id"]}), key=lambda e: e["t"])
        assert [e["action"]["type"] for e in human] == [
            "click", "type", "type", "clipboard_set"], human
        assert [e["action"]["text"] for e in human[1:]] == ["human", " 日本語 ✓", " 日本語 ✓"]
        assert abs(human[0]["screen_point"]["x"] - field["x"]) <= 2
        events = [e["event"]["type"] for e in entries if e["kind"] == "event"]
        assert "human_took_control" in events and "human_handed_back" in events
    finally:
        client.delete(f"/v1/sessions/{sid}/control")
        client.delete(f"/v1/sessions/{sid}/recording")


def test_tokens_never_reach_the_log(
    captured_log: list[str], client: httpx.Client, session: dict[str, Any]
) -> None:
    issued = client.post(f"/v1/sessions/{session['id']}/tokens", json={"scope": "control"})
    token = issued.json()["token"]
    with RfbViewer(vnc_url(session, token)) as viewer:
        viewer.full_frame()
    httpx.get(session["urls"]["view"], params={"token": token})
    httpx.get(session["urls"]["view"] + "/status", params={"token": token + "x"})
    refused(vnc_url(session, token + "x"))
    client.delete(f"/v1/sessions/{session['id']}/tokens/{issued.json()['id']}")
    refused(vnc_url(session, token))
    text = "\n".join(captured_log)
    assert "/vnc" in text and "/view" in text  # the requests were logged...
    assert token not in text and token[4:20] not in text  # ...without the token


# -- the clipboard ------------------------------------------------------------------------


def actions(client: httpx.Client, session: dict[str, Any], *batch: dict[str, Any]) -> Any:
    response = client.post(f"/v1/sessions/{session['id']}/actions", json={"actions": list(batch)})
    assert response.status_code == 200, response.text
    return response.json()["results"]


def test_clipboard_set_paste_copy_get(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    ox, oy = origin
    text = "Ñandú — 美しい 👍 clip"
    field = {"type": "click", "x": ox + 900, "y": oy + 175}
    results = actions(client, session, {"type": "clipboard_set", "text": text},
                      {"type": "clipboard_get"})
    assert results == [{}, {"text": text}]
    actions(client, session, field, {"type": "key", "keys": "ctrl+a"},
            {"type": "key", "keys": "BackSpace"}, {"type": "key", "keys": "ctrl+v"})
    assert page.wait_value(text) == text
    # Copied in the session (the browser owns the clipboard now): read back through X.
    actions(client, session, field, {"type": "key", "keys": "ctrl+a"},
            {"type": "type", "text": "copied 123"}, {"type": "key", "keys": "ctrl+a"},
            {"type": "key", "keys": "ctrl+c"})
    deadline = time.monotonic() + 5
    while (got := actions(client, session, {"type": "clipboard_get"})[0]["text"]) != (
        "copied 123"
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == "copied 123"


def test_clipboard_is_bounded(client: httpx.Client, session: dict[str, Any]) -> None:
    response = client.post(f"/v1/sessions/{session['id']}/actions",
                           json={"type": "clipboard_set", "text": "x" * 200_001})
    assert_error(response, 422, "invalid_request")


def test_clipboard_reaches_viewers_and_back(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    token = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, token)) as viewer:
        viewer.full_frame()
        actions(client, session, {"type": "clipboard_set", "text": "to the viewer"})
        # x11vnc may first pass on what was on the clipboard when the viewer came; it drops
        # the first change after a viewer came, which the owner's second CUT_BUFFER0 write
        # a second later gets through (~1 s; later changes in ~20 ms).
        seen: list[bytes] = []
        deadline = time.monotonic() + 4
        while b"to the viewer" not in seen:
            assert time.monotonic() < deadline, seen
            seen.append(viewer.wait_cut_text(timeout_s=deadline - time.monotonic()))
        viewer.cut_text_to_server("from thé viewer".encode("latin-1"))  # as RFB says
        deadline = time.monotonic() + 3
        while (got := actions(client, session, {"type": "clipboard_get"})[0]["text"]) != (
            "from thé viewer"
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == "from thé viewer"
        actions(client, session, {"type": "clipboard_set", "text": "bäck ✓"})
        # The owner's second write of the first text may still be on its way to the
        # viewer: a repeat of it is stale, anything else must be the new text.
        deadline = time.monotonic() + 4
        while (cut := viewer.wait_cut_text(timeout_s=deadline - time.monotonic())) == (
            b"to the viewer"
        ):
            pass
        assert cut == "bäck ?".encode("latin-1")


def _focus_field(viewer: RfbViewer, page: EventPage, origin: tuple[int, int]) -> None:
    """The viewer clicks the page's text field, until the page says it has the focus."""
    viewer.full_frame()
    viewer.click(origin[0] + 900, origin[1] + 175)
    deadline = time.monotonic() + 5
    while page.cdp.evaluate("document.activeElement && document.activeElement.id") != "field":
        assert time.monotonic() < deadline, "the click did not focus the field"
        time.sleep(0.05)


def test_a_viewers_lock_keys_change_nothing_in_the_session(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    """A viewer's Caps Lock and Num Lock, as noVNC sends them: the keysyms after them carry
    the lock already ("A" with Caps Lock on, KP_Home with Num Lock off). x11vnc applied
    the lock in the session too: the person's capitals came out small, the keypad's Home
    typed 7, and the agent's typing came out inverted until someone pressed it again."""
    token = token_for(client, session["id"], "control")
    page.cdp.evaluate("document.getElementById('field').value = ''")
    caps_lock, num_lock, kp_home = 0xFFE5, 0xFF7F, 0xFF95
    with RfbViewer(vnc_url(session, token)) as viewer:
        _focus_field(viewer, page, origin)
        for keysym in (0x62, caps_lock, 0x43, num_lock, kp_home, 0x41):  # b, Caps, C, Num, Home, A
            viewer.key(keysym, True)
            viewer.key(keysym, False)
        viewer.full_frame()  # all of it reached the server
        assert page.wait_value("AbC") == "AbC"
    typed = client.post(f"/v1/sessions/{session['id']}/actions",
                        json={"type": "type", "text": "Dd"})
    assert typed.status_code == 200, typed.text
    assert page.wait_value("ADdbC") == "ADdbC"  # after the A, where the caret is


@pytest.mark.slow
def test_a_viewer_types_characters_off_the_layout_whole_and_in_order(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    """A control viewer's keys for characters a US layout lacks (as noVNC sends them:
    Latin-1 keysyms, Unicode's 0x1000000 + U), between plain ones, 30 ms apart. x11vnc
    mapped each new one and pressed it at once, before Chromium had re-read the layout:
    0 to 6 of 15 such first presses were lost per run. The agent types them now."""
    token = token_for(client, session["id"], "control")
    text = "aüböc中d中eßfñα日本語✓g"
    page.cdp.evaluate("document.getElementById('field').value = ''")
    with RfbViewer(vnc_url(session, token)) as viewer:
        _focus_field(viewer, page, origin)
        for char in text:
            keysym = ord(char) if ord(char) < 0x100 else 0x01000000 + ord(char)
            viewer.key(keysym, True)
            viewer.key(keysym, False)
            time.sleep(0.03)
        assert page.wait_value(text, timeout_s=15) == text


def test_the_view_pages_clipboard_route_carries_any_unicode(
    client: httpx.Client, server: Server, session: dict[str, Any]
) -> None:
    """What the page's clipboard panel uses in place of RFB's Latin-1 cut text: a view
    token reads the whole text, a control token pastes it (while a human holds control
    too: it is the human's doing); bad input is a 4xx with the error body."""
    sid = session["id"]
    route = f"{server.url}/v1/sessions/{sid}/view/clipboard"
    view, control = (token_for(client, sid, scope) for scope in ("view", "control"))
    text = "Ñandú ✓ 中文 👍"
    actions(client, session, {"type": "clipboard_set", "text": text})
    read = httpx.get(route, params={"token": view})
    assert read.status_code == 200 and read.json() == {"text": text}, read.text
    pasted = "fróm thé viewer ✓ 中"
    assert_error(httpx.post(route, params={"token": view}, json={"text": pasted}),
                 403, "forbidden")
    assert_error(httpx.post(route, json={"text": pasted}), 401, "unauthorized")
    taken = httpx.post(f"{server.url}/v1/sessions/{sid}/control", params={"token": control},
                       json={"lease_s": 60})
    assert taken.status_code == 200, taken.text
    try:
        # The agent waits while the human drives; the human's paste does not.
        assert_error(client.post(f"/v1/sessions/{sid}/actions",
                                 json={"type": "clipboard_set", "text": "agent"}),
                     409, "human_in_control")
        done = httpx.post(route, params={"token": control}, json={"text": pasted})
        assert done.status_code == 204, done.text
    finally:
        assert client.delete(f"/v1/sessions/{sid}/control").status_code == 200
    assert actions(client, session, {"type": "clipboard_get"})[0]["text"] == pasted
    assert httpx.get(route, params={"token": control}).json() == {"text": pasted}
    for bad in ({"text": "x" * 200_001}, {"text": 7}, {}, {"text": "a", "more": 1}):
        assert_error(httpx.post(route, params={"token": control}, json=bad),
                     422, "invalid_request")
    assert_error(httpx.post(route, params={"token": control}, content=b"{not json",
                            headers={"Content-Type": "application/json"}),
                 422, "invalid_request")


def test_the_view_pages_type_route_types_any_unicode(
    client: httpx.Client, server: Server, session: dict[str, Any], page: EventPage,
    origin: tuple[int, int],
) -> None:
    """The panel's "Type into the session" (for text an input method composed, which the
    canvas never gets as keys): a control token types into the focused field as the
    ``type`` action does; a view token may not; bad input is a 4xx with the error body."""
    ox, oy = origin
    sid = session["id"]
    route = f"{server.url}/v1/sessions/{sid}/view/type"
    view, control = (token_for(client, sid, scope) for scope in ("view", "control"))
    actions(client, session, {"type": "click", "x": ox + 900, "y": oy + 175},
            {"type": "key", "keys": "ctrl+a"}, {"type": "key", "keys": "BackSpace"})
    text = "かな漢字 Ñandú ✓ 👍"
    assert_error(httpx.post(route, params={"token": view}, json={"text": text}),
                 403, "forbidden")
    assert_error(httpx.post(route, json={"text": text}), 401, "unauthorized")
    typed = httpx.post(route, params={"token": control}, json={"text": text})
    assert typed.status_code == 204, typed.text
    assert page.wait_value(text) == text
    for bad in ({"text": ""}, {"text": "x" * 20_001}, {"text": 7}, {},
                {"text": "a", "more": 1}):
        assert_error(httpx.post(route, params={"token": control}, json=bad),
                     422, "invalid_request")
    assert page.field_value() == text


def test_clipboard_reaches_two_new_viewers_in_seconds(
    client: httpx.Client, session: dict[str, Any]
) -> None:
    """x11vnc passes no CUT_BUFFER0 change on for a few seconds after viewers came (about
    5 s with three): the agent writes it again each second for 8 s. With one rewrite, two
    viewers got the first change 16 s late (x11vnc's own fallback)."""
    token = token_for(client, session["id"], "control")
    with RfbViewer(vnc_url(session, token)) as one, RfbViewer(vnc_url(session, token)) as two:
        one.full_frame()
        two.full_frame()
        actions(client, session, {"type": "clipboard_set", "text": "to both"})
        started = time.monotonic()
        for viewer in (one, two):
            while viewer.wait_cut_text(timeout_s=20) != b"to both":
                pass
        assert time.monotonic() - started < 8


def test_uvicorn_websocket_lines_are_redacted() -> None:
    """uvicorn logs 'WebSocket /path?query [accepted]' (its own logger, not the access log)."""
    record = logging.makeLogRecord({
        "name": "uvicorn.error", "levelno": logging.INFO, "msg": '%s - "WebSocket %s" [accepted]',
        "args": ("127.0.0.1:5", "/v1/sessions/ses_1/vnc?token=dbt_abcDEF-123_x&x=1"),
        "color_message": "WebSocket /v1/sessions/ses_1/vnc?token=dbt_abcDEF-123_x",
    })
    assert RedactTokens().filter(record)
    assert "dbt_abc" not in record.getMessage() and "token=[redacted]&x=1" in record.getMessage()
    assert "dbt_abc" not in record.color_message


def test_no_token_for_a_session_that_ended(client: httpx.Client) -> None:
    """A token's link would open nothing once the session ended: 404, as every other call
    on it (a model's view_url used to hand out such links)."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    refused = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "view"})
    assert f"session {sid} is stopped" in assert_error(refused, 404, "not_found")["message"]


def test_a_sessions_viewers_are_bounded(
    client: httpx.Client, session: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each viewer holds one of the session's agent streams (128, shared with commands,
    files and DevTools): one view token opening viewers without end starved the rest."""
    monkeypatch.setattr(vnc_hub, "MAX_VIEWERS_PER_SESSION", 2)
    token = token_for(client, session["id"], "view")
    with RfbViewer(vnc_url(session, token)), RfbViewer(vnc_url(session, token)):
        with pytest.raises(InvalidStatus) as refused:
            RfbViewer(vnc_url(session, token))
        assert refused.value.response.status_code == 429
        assert b"2 live viewers" in refused.value.response.body
    # Room again once they left: the server hears of their close a moment after it.
    deadline = time.monotonic() + 10
    while True:
        try:
            again = RfbViewer(vnc_url(session, token))
            break
        except InvalidStatus as error:
            assert error.response.status_code == 429 and time.monotonic() < deadline, error
            time.sleep(0.05)
    with again:
        assert again.updates >= 0


def test_a_viewer_gone_before_it_was_accepted_leaves_no_stream(
    server: Server, client: httpx.Client, session: dict[str, Any],
) -> None:
    """Its VNC connection (an agent stream and an x11vnc client) stayed open until the
    last viewer of the session left; 126 of them starved the session's agent connection."""
    token = token_for(client, session["id"], "view")
    agent = server.handle(session["id"]).agent
    assert agent is not None
    streams = agent._conn._streams  # the connection's open HTTP/2 streams
    host, port = server.url.removeprefix("http://").split(":")
    with RfbViewer(vnc_url(session, token)):  # keeps the VNC server running
        held = len(streams)
        for _ in range(10):
            with socket.create_connection((host, int(port))) as gone:
                gone.sendall(
                    f"GET /v1/sessions/{session['id']}/vnc?token={token} HTTP/1.1\r\n"
                    f"Host: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        time.sleep(1)  # for the server to take them up (each opened a stream in ~10 ms)
        deadline = time.monotonic() + 10
        while len(streams) > held:
            assert time.monotonic() < deadline, f"{len(streams) - held} streams left open"
            time.sleep(0.1)
