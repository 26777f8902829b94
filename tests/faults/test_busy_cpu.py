"""A session whose CPU its own commands take: a settled screenshot after a click still shows
what the click did (settle.py and cpu_waits.py, inside the sandbox's agent).

Six busy loops in a sandbox of one CPU leave Chromium a few milliseconds in each 100: the
screen can stay still for the settle's 100 ms before the browser has even read the click.
Settling counts only quiet in which the desktop's programs were not kept waiting for a CPU,
so ``settled: true`` comes with the page's answer to the click on it; a screen that could
not be seen to settle in the bound says ``settled: false``, never the page before the click.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from PIL import Image

from ..api.conftest import DISPLAY, Server
from ..api.containers import container_server

pytestmark = pytest.mark.slow

# Each click turns the page from green to red or back.
PAGE = "data:text/html," + quote(
    "<body style='margin:0;background:#0a0' onclick=\"window.n = (window.n || 0) + 1;"
    "document.body.style.background = window.n % 2 ? '#d00' : '#0a0'\"></body>")
LOOPS = 6
CLICKS = 15
# An agent's next action comes after its model's turn: the page's work on one click (it
# goes on unseen, at a few per cent of a CPU) is then not the next click's reaction.
TURN_S = 0.3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "busy") as running:
        yield running


@pytest.fixture
def busy_session(client: httpx.Client) -> Iterator[str]:
    created = client.post("/v1/sessions", json={
        "display": DISPLAY, "browser": {"start_url": PAGE}, "resources": {"cpus": 1}})
    assert created.status_code == 201, created.text
    session_id: str = created.json()["id"]
    try:
        deadline = time.monotonic() + 20
        while not green(client, session_id):
            assert time.monotonic() < deadline, "the page was never painted"
            time.sleep(0.1)
        for _ in range(LOOPS):
            loop = client.post(f"/v1/sessions/{session_id}/exec", json={
                "cmd": ["sh", "-c", "while :; do :; done"], "background": True})
            assert loop.status_code == 200, loop.text
        yield session_id
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def red(reply: dict[str, Any]) -> bool:
    return colour(base64.b64decode(reply["screenshot"]["data_b64"]))[0] > 150


def green(client: httpx.Client, session_id: str) -> bool:
    shot = client.get(f"/v1/sessions/{session_id}/screenshot", params={"format": "png"})
    assert shot.status_code == 200, shot.text
    r, g, _ = colour(shot.content)
    return r < 50 and g > 130


def colour(png: bytes) -> tuple[int, int, int]:
    pixel = Image.open(io.BytesIO(png)).convert("RGB").getpixel((640, 600))
    assert isinstance(pixel, tuple)
    return pixel[0], pixel[1], pixel[2]


def test_a_settled_screenshot_shows_the_clicks_effect_while_commands_take_the_cpu(
        client: httpx.Client, busy_session: str) -> None:
    settled = 0
    for click in range(1, CLICKS + 1):
        time.sleep(TURN_S)
        reply = client.post(f"/v1/sessions/{busy_session}/actions", json={
            "actions": [{"type": "click", "x": 640, "y": 400}],
            "screenshot": {"format": "png"}})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        if body["settled"]:
            settled += 1
            assert red(body) is (click % 2 == 1), f"click {click}: the page before it"
        else:  # honest, but it must be rare: then the next click waits for this one's end
            look = client.post(f"/v1/sessions/{busy_session}/actions", json={
                "actions": [{"type": "wait", "ms": 2000}], "screenshot": {"format": "png"}})
            assert red(look.json()) is (click % 2 == 1), f"click {click} never showed"
    assert settled >= CLICKS - 3, f"only {settled} of {CLICKS} screenshots settled"
