"""A settled screenshot after a click on a link waits for the next page (settle.py).

Settling watches only the screen: it ends once nothing was drawn for ``quiet_s``. A page
that takes a while to answer draws nothing of its own meanwhile, but the browser's tab
strip animates its loading throbber the whole time, so the screen does not fall quiet
until the new page is painted. A page slower than the settle's bound is answered with
``settled: false``, not with the old page passed off as settled.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from .helpers import decode, near

START = (0, 170, 0)
NEXT = (221, 0, 0)


class _Pages(BaseHTTPRequestHandler):
    """``/start?wait=S``: a link over the whole page to ``/next?wait=S``, which answers
    after S seconds."""

    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        path, _, wait = self.path.partition("?wait=")
        if path == "/next":
            time.sleep(float(wait))
            body = "<body style='margin:0;background:#d00'></body>"
        elif path == "/start":
            body = (f"<body style='margin:0;background:#0a0'><a href='/next?wait={wait}' "
                    "style='display:block;width:100vw;height:100vh'></a></body>")
        else:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    """The pages' origin, on loopback (the local backend's browser shares the network)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def click_a_link(client: httpx.Client, pages: str, wait_s: float) -> dict[str, Any]:
    """A session on the start page, then a click on its link with a settled screenshot:
    the reply, with the colour at the click's point in ``colour``."""
    created = client.post("/v1/sessions", json={
        "display": {"width": 1280, "height": 800},
        "browser": {"start_url": f"{pages}/start?wait={wait_s}"}})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    try:
        deadline = time.monotonic() + 20
        while not near(decode(client.get(f"/v1/sessions/{session_id}/screenshot").content)
                       .getpixel((640, 500)), START):
            assert time.monotonic() < deadline, "the start page was never painted"
            time.sleep(0.1)
        response = client.post(f"/v1/sessions/{session_id}/actions", json={
            "actions": [{"type": "click", "x": 640, "y": 500}],
            "screenshot": {"format": "png"}})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        image = decode(base64.b64decode(body["screenshot"]["data_b64"]))
        body["colour"] = image.getpixel((640, 500))
        return body
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def test_the_settled_screenshot_shows_the_page_the_link_led_to(
    client: httpx.Client, pages: str
) -> None:
    body = click_a_link(client, pages, wait_s=0.5)  # five times the quiet that settles
    assert body["settled"] is True
    assert near(body["colour"], NEXT), body["colour"]


def test_a_page_slower_than_the_settle_bound_is_not_called_settled(
    client: httpx.Client, pages: str
) -> None:
    body = click_a_link(client, pages, wait_s=4.0)  # the bound is 2 s (settle.py)
    assert body["settled"] is False
