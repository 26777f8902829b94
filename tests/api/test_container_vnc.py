"""The live view of a sandboxed (container) session, end to end.

x11vnc runs inside the sandbox on a unix socket of its socket directory; a headless
Chromium on the host opens the view link (the page and noVNC of vnc/) and its canvas shows
the session's page; a real VNC client library (vncdotool) goes through the websocket proxy;
a view token's crafted input changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from deskbox_server.agent.vnc import AgentVnc
from deskbox_server.sessions.desktop import AnyDesktop

from ..cdp_page import CdpPage
from ..headless import canvas_pixel, headless_chromium, websocket_bridge
from ..rfb_client import RfbViewer
from .conftest import Server
from .containers import (
    container_server,
    open_session,
    page_origin,
    sandbox_handle,
    sandbox_page,
)
from .helpers import token_for
from .sandbox_page import SandboxPage

pytestmark = pytest.mark.slow

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "vnc") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    with open_session(client) as body:
        yield body


@pytest.fixture(scope="module")
def handle(server: Server, session: dict[str, Any]) -> AnyDesktop:
    return sandbox_handle(server, session)


@pytest.fixture(scope="module")
def page(client: httpx.Client, session: dict[str, Any]) -> Iterator[SandboxPage]:
    with sandbox_page(client, session) as page:
        yield page


@pytest.fixture(scope="module")
def origin(client: httpx.Client, session: dict[str, Any], page: SandboxPage) -> tuple[int, int]:
    return page_origin(client, session, page)


def vnc_url(session: dict[str, Any], value: str) -> str:
    return f"{session['urls']['vnc_ws']}?token={value}"


def test_x11vnc_listens_only_on_a_unix_socket(
    server: Server, client: httpx.Client, session: dict[str, Any], handle: AnyDesktop
) -> None:
    with RfbViewer(vnc_url(session, token_for(client, session["id"], "view"))):
        vnc = server.services.vnc.server(session["id"])
        assert vnc is not None and vnc.failure() is None
        pid = handle.sandbox.init_pid
        # No VNC port listens, even in the sandbox's own network namespace (the browser's
        # DevTools port is the CDP proxy's business)...
        for table in ("tcp", "tcp6"):
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            listening = [int(row.split()[1].rsplit(":", 1)[1], 16) for row in rows
                         if row.split()[3] == "0A"]
            assert not [port for port in listening if 5800 <= port < 6000], (table, listening)
        # ...it listens on a unix socket inside the sandbox, which the host reaches only
        # as a channel of the agent's stream.
        assert isinstance(vnc, AgentVnc)
        inside = handle.sandbox.socket_dir / Path(vnc.socket_path).name
        assert inside.is_socket()
        assert not list(handle.sandbox.display_dir.glob("vnc-*"))  # no host link to it
    deadline = time.monotonic() + 10
    while server.services.vnc.server(session["id"]) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while inside.exists():  # removed through the agent when the last viewer left
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_view_link_in_headless_chromium(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], origin: tuple[int, int],
    page: SandboxPage,
) -> None:
    ox, oy = origin
    link = f"{session['urls']['view']}?token={token_for(client, session['id'], 'view')}"
    with headless_chromium(tmp_path / "viewer") as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        assert canvas_pixel(cdp, ox + 200, oy + 150, RED) == list(RED)
        assert canvas_pixel(cdp, ox + 500, oy + 150, GREEN) == list(GREEN)
        assert canvas_pixel(cdp, ox + 200, oy + 350, BLUE) == list(BLUE)
        state = cdp.evaluate("[window.__deskbox.scope, window.__deskbox.state, "
                             "window.__deskbox.rfb.viewOnly]")
        assert state == ["view", "running", True]
        # noVNC scaled the desktop to the window (1280 wide, minus nothing; 800 - the bar).
        scaled = cdp.evaluate("document.querySelector('#screen canvas')"
                              ".getBoundingClientRect().height")
        assert scaled <= 860 - 28 + 1


def test_control_viewer_in_chromium_clicks_the_page(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], origin: tuple[int, int],
    page: SandboxPage,
) -> None:
    ox, oy = origin
    link = f"{session['urls']['view']}?token={token_for(client, session['id'], 'control')}"
    before = page.wait(lambda state: True)["clicks"]
    with headless_chromium(tmp_path / "controller") as devtools, CdpPage.first(devtools) as cdp:
        cdp.navigate(link)
        assert canvas_pixel(cdp, ox + 200, oy + 150, RED) == list(RED)
        assert cdp.evaluate("window.__deskbox.rfb.viewOnly") is False
        box = cdp.evaluate("""(() => { const c = document.querySelector('#screen canvas');
            const r = c.getBoundingClientRect();
            return [r.left, r.top, r.width / c.width]; })()""")
        x, y = box[0] + (ox + 150) * box[2], box[1] + (oy + 150) * box[2]
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            cdp.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                  "button": "left", "clickCount": 1})
        state = page.wait(lambda state: state["clicks"] > before)
    assert state["clicks"] == before + 1
    assert abs(state["click"][0] - 150) <= 2 and abs(state["click"][1] - 150) <= 2


def test_view_token_crafted_input_changes_nothing(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int], page: SandboxPage
) -> None:
    ox, oy = origin
    before = page.wait(lambda state: True)
    with RfbViewer(vnc_url(session, token_for(client, session["id"], "view"))) as viewer:
        viewer.full_frame()
        viewer.click(ox + 150, oy + 150)
        viewer.pointer(ox + 900, oy + 175, 1)
        viewer.pointer(ox + 900, oy + 175, 0)
        for keysym in (0x68, 0x69):
            viewer.key(keysym, True)
            viewer.key(keysym, False)
        viewer.full_frame()
    time.sleep(1.0)
    after = page.wait(lambda state: True)
    assert (after["clicks"], after["value"]) == (before["clicks"], before["value"])


def test_two_viewers_and_an_agent_at_once(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int], page: SandboxPage
) -> None:
    ox, oy = origin
    before = page.wait(lambda state: True)["clicks"]
    with RfbViewer(vnc_url(session, token_for(client, session["id"], "view"))) as one, \
            RfbViewer(vnc_url(session, token_for(client, session["id"], "control"))) as two:
        for viewer in (one, two):
            assert tuple(viewer.full_frame()[oy + 150, ox + 200]) == RED
        response = client.post(f"/v1/sessions/{session['id']}/actions", json={"actions": [
            {"type": "click", "x": ox + 250, "y": oy + 130}]})
        assert response.status_code == 200
        two.click(ox + 260, oy + 140)
        state = page.wait(lambda state: state["clicks"] >= before + 2)
        assert state["clicks"] == before + 2
        for viewer in (one, two):
            assert tuple(viewer.full_frame()[oy + 350, ox + 200]) == BLUE


def test_vncdotool_through_the_websocket_proxy(
    tmp_path: Path, client: httpx.Client, session: dict[str, Any], origin: tuple[int, int],
    page: SandboxPage,
) -> None:
    from vncdotool import api

    ox, oy = origin
    before = page.wait(lambda state: True)["clicks"]
    with websocket_bridge(vnc_url(session, token_for(client, session["id"], "control"))) as port:
        vnc = api.connect(f"127.0.0.1::{port}", password=None, timeout=30)
        try:
            vnc.captureScreen(str(tmp_path / "screen.png"))
            vnc.mouseMove(ox + 170, oy + 160)
            vnc.mousePress(1)
            # One more round trip: x11vnc has handled the click before we hang up.
            vnc.captureScreen(str(tmp_path / "after.png"))
        finally:
            vnc.disconnect()
    from PIL import Image

    image = Image.open(tmp_path / "screen.png").convert("RGB")
    assert image.size == (1280, 800)
    assert image.getpixel((ox + 200, oy + 150)) == RED
    # The title mirrors events one at a time: wait for the state that shows this click.
    state = page.wait(lambda state: state["clicks"] > before and state["click"][:2] == [170, 160])
    assert state["click"][:2] == [170, 160]


def test_a_viewer_that_floods_a_frozen_session_then_leaves_is_let_go(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    """A viewer sends more than the frozen VNC server takes, then leaves: its handler,
    waiting to pass that input on, never read the viewer again, so it (and its place among
    the session's 32 viewers) stayed until the session resumed."""
    with container_server(tmp_path_factory, "vnc-flood", ws_send_timeout_s=2) as flooded, \
            flooded.client() as http, open_session(http) as body:
        _flood_a_frozen_session_then_leave(http, body, caplog)


def _flood_a_frozen_session_then_leave(
    client: httpx.Client, session: dict[str, Any], caplog: pytest.LogCaptureFixture,
) -> None:
    sid = session["id"]
    caplog.set_level(logging.INFO, logger="deskbox.vnc")
    viewer = RfbViewer(vnc_url(session, token_for(client, sid, "control")))
    try:
        paused = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
        assert paused.status_code == 200, paused.text

        def flood() -> None:
            with contextlib.suppress(Exception):  # until its socket is closed under it
                for _ in range(8):
                    viewer.cut_text_to_server(b"x" * ((1 << 20) - 64))

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        sender.join(3)  # its sends block: nothing upstream reads them
        assert isinstance(viewer.ws, ClientConnection)
        viewer.ws.socket.close()  # gone, without a close frame
        deadline = time.monotonic() + 2 + 5  # the send timeout, then the close
        while not any(f"session {sid}: control viewer" in r.getMessage()
                      for r in caplog.records):
            assert time.monotonic() < deadline, "the viewer's handler did not end"
            time.sleep(0.1)
        assert any("took none of the viewer's input for 2 s" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        viewer.close()
        client.post(f"/v1/sessions/{sid}/resume")
