"""The web console (``GET /``) and its replay page (``GET /replay``), as a person uses them.

A real server with container (runc) sessions; the pages run in a headless Chromium (the
system's, driven by Playwright over a pipe: no port). Every assertion is on what the page
shows: the sign-in error, a card's thumbnail pixels, the cards' order, the live view that
opens and connects, the replay's step list, frame and marker.

One server, one recorded session (and one made from the UI) serve the whole module.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import sqlite3
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from ..headless import CHROMIUM
from ..images import session_image
from .conftest import DISPLAY, KEY_A, Server
from .containers import act, container_server

pytestmark = pytest.mark.slow

# White until clicked, then red: a change the thumbnail and the recording both show.
BLANK_THEN_RED = "data:text/html;base64," + base64.b64encode(b"""<!doctype html>
<html style="height:100%"><body style="margin:0;height:100%;background:#fff"
onclick="document.body.style.background='#d00000'"></body></html>""").decode()
CLICK = (640, 450)
REASON = "a captcha on the login page"
TIMEOUT_MS = 20_000

# The thumbnail's pixel at its centre, read back from the <img> the page shows.
_THUMB_PIXEL = """(id) => {
  const img = document.querySelector(`.card[data-id="${id}"] .thumb img`);
  if (!img || !img.complete || !img.naturalWidth || !img.src.startsWith('blob:')) return null;
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(img, 0, 0);
  const d = context.getImageData(canvas.width >> 1, canvas.height >> 1, 1, 1).data;
  return {src: img.src, pixel: [d[0], d[1], d[2]]};
}"""

_FRAME_LOADED = """() => {
  const image = document.getElementById('frame');
  return image.complete && image.naturalWidth > 0 && !document.getElementById('marker').hidden;
}"""
# The replay's frame: its size, its pixel at a screen point, its box and the marker's centre.
_FRAME_AND_MARKER = """([x, y]) => {
  const image = document.getElementById('frame');
  const canvas = document.createElement('canvas');
  canvas.width = image.naturalWidth;
  canvas.height = image.naturalHeight;
  const context = canvas.getContext('2d');
  context.drawImage(image, 0, 0);
  const d = context.getImageData(x, y, 1, 1).data;
  const box = image.getBoundingClientRect();
  const mark = document.getElementById('marker').getBoundingClientRect();
  return {natural: [image.naturalWidth, image.naturalHeight], pixel: [d[0], d[1], d[2]],
          box: [box.left, box.top, box.width, box.height],
          mark: [mark.left + mark.width / 2, mark.top + mark.height / 2]};
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()  # cached after its first build; minutes if it was not
    with container_server(tmp_path_factory, "console") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.fixture(scope="module")
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    """The module's session: recorded, showing the white page."""
    response = client.post("/v1/sessions", json={
        "display": DISPLAY, "browser": {"start_url": BLANK_THEN_RED}, "record": True,
        "labels": {"suite": "console"},
    })
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    try:
        yield body
    finally:
        client.delete(f"/v1/sessions/{body['id']}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    # Chromium's temporary files in a directory of ours, removed however it ends.
    scratch = tempfile.mkdtemp(prefix="dbx-console-")
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
                env={**os.environ, "TMPDIR": scratch},
            )
            try:
                yield launched
            finally:
                launched.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class Watched:
    """A tab and what went wrong in it: uncaught exceptions and console errors."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)


@pytest.fixture(scope="module")
def console(browser: Browser, server: Server, session: dict[str, Any]) -> Iterator[Watched]:
    """A tab signed in to the console with the key that owns the session."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    watched = Watched(context.new_page())
    try:
        page = watched.page
        page.goto(server.url + "/")
        page.fill("#key", KEY_A)
        page.click("#sign-in-form button[type=submit]")
        expect(card(page, session["id"])).to_be_visible(timeout=TIMEOUT_MS)
        yield watched
    finally:
        context.close()


@pytest.fixture
def quiet(console: Watched) -> Iterator[Page]:
    """The console tab for one test, which must leave no error in its console."""
    console.errors.clear()
    yield console.page
    assert console.errors == []


def card(page: Page, session_id: str) -> Any:
    return page.locator(f'.card[data-id="{session_id}"]')


def wait_for(page: Page, script: str, arg: Any = None, until: Any = bool) -> Any:
    """The value of ``script`` in the page once ``until`` accepts it (20 s at most). Polled
    from here: the pages' CSP (no eval) refuses Playwright's in-page wait_for_function."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not until(value := page.evaluate(script, arg)):
        assert time.monotonic() < deadline, f"still {value!r}"
        page.wait_for_timeout(100)
    return value


def eventually(check: Any) -> None:
    """Wait (20 s at most) until ``check()`` is true: what the server says, polled."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while not check():
        assert time.monotonic() < deadline, "it never came"
        time.sleep(0.1)


def near(pixel: list[int], expected: tuple[int, int, int], tolerance: int = 40) -> bool:
    return all(abs(p - e) <= tolerance for p, e in zip(pixel, expected, strict=True))


# -- the pages --------------------------------------------------------------------------------


def test_pages_are_served_with_strict_headers(server: Server) -> None:
    for path, script in (("/", "/vnc/static/console.js"), ("/replay", "/vnc/static/replay.js")):
        response = httpx.get(server.url + path)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/html")
        assert response.headers["cache-control"] == "no-store"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert response.headers["x-content-type-options"] == "nosniff"
        policy = response.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
        assert f'<script type="module" src="{script}">' in response.text
        assert "<script>" not in response.text and "$" not in response.text
        # A browser runs module scripts only with a JavaScript type.
        asset = httpx.get(server.url + script)
        assert asset.status_code == 200
        assert asset.headers["content-type"].startswith("text/javascript")
    assert "/" not in httpx.get(server.url + "/openapi.json").json()["paths"]  # not an API
    # FastAPI's own pages loaded unpinned CDN scripts onto the origin the console's key is on.
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + page).status_code == 404, page


# -- sign-in --------------------------------------------------------------------------------


def test_sign_in_shows_the_servers_error_then_the_keys_sessions(
    browser: Browser, server: Server, session: dict[str, Any]
) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(server.url + "/")
        expect(page.locator("#sign-in")).to_be_visible()
        expect(page.locator("#app")).to_be_hidden()
        page.fill("#key", "not-a-key-of-this-server")
        page.click("#sign-in-form button[type=submit]")
        error = page.locator("#sign-in-error")
        expect(error).to_be_visible()
        expect(error).to_contain_text("invalid API key")  # the server's own message
        expect(error).to_contain_text("req_")
        assert page.evaluate("sessionStorage.length") == 0

        page.fill("#key", KEY_A)
        page.click("#sign-in-form button[type=submit]")
        expect(card(page, session["id"])).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.locator("#sign-in")).to_be_hidden()
        page.reload()  # the key is kept by the tab...
        expect(card(page, session["id"])).to_be_visible(timeout=TIMEOUT_MS)
        page.click("#sign-out")  # ...until it signs out
        expect(page.locator("#sign-in")).to_be_visible()
        expect(page.locator(".card")).to_have_count(0)
        assert page.evaluate("sessionStorage.length") == 0
    finally:
        context.close()


# -- sessions -------------------------------------------------------------------------------


def test_the_thumbnail_follows_the_screen(
    quiet: Page, client: httpx.Client, session: dict[str, Any]
) -> None:
    page, sid = quiet, session["id"]
    expect(card(page, sid).locator(".state")).to_have_text("running")
    expect(card(page, sid).locator(".labels")).to_contain_text("suite: console")
    before = wait_for(page, _THUMB_PIXEL, sid)
    assert near(before["pixel"], (255, 255, 255)), before
    act(client, session, {"type": "click", "x": CLICK[0], "y": CLICK[1]})
    after = wait_for(page, _THUMB_PIXEL, sid, lambda t: t and near(t["pixel"], (208, 0, 0)))
    assert after["src"] != before["src"]  # a new picture, fetched by a poll


def test_pause_and_resume_from_the_card(
    quiet: Page, client: httpx.Client, session: dict[str, Any]
) -> None:
    page, sid = quiet, session["id"]
    it = card(page, sid)
    it.locator("button[data-act=pause]").click()
    expect(it.locator(".state")).to_have_text("paused", timeout=TIMEOUT_MS)
    expect(it.locator(".frozen")).to_be_visible()
    expect(it.locator("button[data-act=resume]")).to_be_visible()
    expect(it.locator("button[data-act=pause]")).to_be_hidden()
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    it.locator("button[data-act=resume]").click()
    expect(it.locator(".state")).to_have_text("running", timeout=TIMEOUT_MS)
    expect(it.locator(".frozen")).to_be_hidden()
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "running"


def test_a_refused_call_shows_the_servers_message(
    console: Watched, session: dict[str, Any]
) -> None:
    page = console.page  # not `quiet`: Chromium logs the 422 to the console itself
    page.fill("#start-url", "ftp://example.org/")
    page.click("#create")
    bar = page.locator("#error")
    expect(bar).to_be_visible(timeout=TIMEOUT_MS)
    expect(bar).to_contain_text("New desktop:")
    expect(bar).to_contain_text("start_url")  # the API's 422 names the field
    page.click("#error-close")
    expect(bar).to_be_hidden()
    page.fill("#start-url", "")


def test_the_live_view_opens_and_connects(quiet: Page, session: dict[str, Any]) -> None:
    page = quiet
    for scope in ("view", "control"):
        with page.context.expect_page(timeout=TIMEOUT_MS) as opened:
            card(page, session["id"]).locator(f"button[data-act={scope}]").click()
        view = opened.value
        try:
            view.wait_for_url(f"**/v1/sessions/{session['id']}/view", timeout=TIMEOUT_MS)
            wait_for(view, "() => Boolean(window.__deskbox && window.__deskbox.connected)")
            expect(view.locator("#state")).to_have_text("connected")
            assert view.evaluate("window.__deskbox.scope") == scope
            expect(view.locator("#screen canvas")).to_be_visible()
            # A tab opened by the console starts with a copy of its session storage: the
            # API key, in the page that parses what the sandbox's VNC server sends. It holds
            # only the token the page took out of its address bar.
            assert view.evaluate("Object.keys(window.sessionStorage)") == [
                f"deskbox.token:/v1/sessions/{session['id']}/view"]
            assert "token=" not in view.url
        finally:
            view.close()


def test_the_live_view_leaves_no_token_in_the_browsers_history(
    browser: Browser, server: Server, session: dict[str, Any], tmp_path: Path
) -> None:
    """The console once sent its tab to ``/view?token=dbt_…``: the page took the token out
    of the address bar, but Chromium's history had recorded the visit (chrome://history
    and the address bar's suggestions offered a link that opened the session for an hour).
    A browser with a profile on disk, as a person's is, signs in and opens both views."""
    profile = tmp_path / "profile"
    context = browser.browser_type.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True,
        args=["--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
        viewport={"width": 1280, "height": 860})
    tokens: list[str] = []
    try:
        page = context.new_page()
        page.on("response", lambda response: tokens.append(response.json()["token"])
                if response.url.endswith("/tokens") and response.ok else None)
        page.goto(server.url + "/")
        page.fill("#key", KEY_A)
        page.click("#sign-in-form button[type=submit]")
        for scope in ("view", "control"):
            with context.expect_page(timeout=TIMEOUT_MS) as opened:
                card(page, session["id"]).locator(f"button[data-act={scope}]").click()
            view = opened.value
            view.wait_for_url(f"**/v1/sessions/{session['id']}/view", timeout=TIMEOUT_MS)
            for _ in range(2):  # and again after a reload, from the tab's storage
                wait_for(view, "() => Boolean(window.__deskbox && window.__deskbox.connected)")
                assert view.evaluate("window.__deskbox.scope") == scope
                view.reload()
            view.close()
    finally:
        context.close()
    assert len(tokens) == 2
    copy = tmp_path / "History"
    shutil.copy(profile / "Default" / "History", copy)
    with contextlib.closing(sqlite3.connect(copy)) as history:
        visited = [url for (url,) in history.execute("SELECT url FROM urls")]
    assert f"{server.url}/v1/sessions/{session['id']}/view" in visited  # history was kept
    assert [url for url in visited if "token" in url] == []
    saved = [path.read_bytes() for path in (profile / "Default" / "Sessions").iterdir()]
    for token in tokens:  # nor in the tabs the browser saved to restore them
        assert not [data for data in saved if token.encode() in data]


def test_a_human_takes_over_in_the_view_and_hands_back(
    quiet: Page, client: httpx.Client, session: dict[str, Any]
) -> None:
    """From the console's Control link, in Playwright: "Take control" refuses the agent's
    actions (looking goes on), the person's click lands on the desktop (the agent's
    cursor_position sees it) and in the recording as the human's, "Hand back" ends it."""
    sid = session["id"]
    with quiet.context.expect_page(timeout=TIMEOUT_MS) as opened:
        card(quiet, sid).locator("button[data-act=control]").click()
    view = opened.value
    try:
        view.wait_for_url(f"**/v1/sessions/{sid}/view", timeout=TIMEOUT_MS)
        wait_for(view, "() => Boolean(window.__deskbox && window.__deskbox.connected)")
        view.click("#take")
        eventually(lambda: client.get(f"/v1/sessions/{sid}/handoff").json()[
            "human_in_control"])
        refused = client.post(f"/v1/sessions/{sid}/actions",
                              json={"type": "click", "x": 5, "y": 5})
        assert refused.status_code == 409 and refused.json()["error"]["type"] == \
            "human_in_control"
        x, y = 321, 234
        canvas = view.locator("#screen canvas")
        box = canvas.bounding_box()
        assert box is not None
        width, height = view.evaluate(
            "() => { const c = document.querySelector('#screen canvas');"
            " return [c.width, c.height]; }")
        view.mouse.click(box["x"] + (x + 0.5) * box["width"] / width,
                         box["y"] + (y + 0.5) * box["height"] / height)
        eventually(lambda: client.post(f"/v1/sessions/{sid}/actions", json={
            "type": "cursor_position"}).json()["results"][0] == {"x": x, "y": y})
        view.click("#hand-back")
        eventually(lambda: not client.get(f"/v1/sessions/{sid}/handoff").json()[
            "human_in_control"])
        assert client.post(f"/v1/sessions/{sid}/actions",
                           json={"type": "move", "x": 5, "y": 5}).status_code == 200
    finally:
        view.close()
    lines = client.get(f"/v1/sessions/{sid}/trajectory").text.splitlines()
    entries = [json.loads(line) for line in lines]
    human = [e for e in entries if e["kind"] == "action" and e["source"]["type"] == "token"]
    assert human and human[-1]["action"] == {"type": "click", "x": x, "y": y}, human
    events = [e["event"]["type"] for e in entries if e["kind"] == "event"]
    assert {"human_took_control", "human_handed_back"} <= set(events), events


def test_create_ask_for_help_and_delete(
    quiet: Page, client: httpx.Client, session: dict[str, Any]
) -> None:
    page, sid = quiet, session["id"]
    cards = page.locator(".card")
    expect(cards).to_have_count(1)
    page.check("#record")
    page.click("#create")
    expect(cards).to_have_count(2, timeout=TIMEOUT_MS)
    made = cards.first.get_attribute("data-id")  # the newest comes first...
    assert made and made != sid
    expect(card(page, made).locator(".state")).to_have_text("running", timeout=TIMEOUT_MS)
    assert client.get(f"/v1/sessions/{made}").json()["state"] == "running"
    expect(page.locator(f'#recording-rows tr[data-id="{made}"] td.col-state')).to_have_text(
        "recording", timeout=TIMEOUT_MS)  # "Record" was ticked
    page.uncheck("#record")

    response = client.post(f"/v1/sessions/{sid}/handoff", json={"reason": REASON})
    assert response.status_code == 200, response.text
    # ...unless another asks for help: it moves to the top, marked, with its reason.
    expect(cards.first).to_have_attribute("data-id", sid, timeout=TIMEOUT_MS)
    expect(cards.first).to_have_class(re.compile(r"\bneeds-help\b"))
    expect(cards.first.locator(".help")).to_have_text(f"needs help: {REASON}")
    expect(card(page, made).locator(".help")).to_be_hidden()

    delete = card(page, made).locator("button[data-act=delete]")
    delete.click()
    expect(delete).to_have_text("Confirm delete")
    assert client.get(f"/v1/sessions/{made}").json()["state"] == "running"
    delete.click()
    expect(card(page, made)).to_have_count(0, timeout=TIMEOUT_MS)
    assert client.get(f"/v1/sessions/{made}").json()["state"] == "stopped"
    expect(page.locator("#ended")).to_contain_text(made)

    # Taking control clears the request; handing back returns the session to its agent.
    assert client.post(f"/v1/sessions/{sid}/control", json={}).status_code == 200
    assert client.delete(f"/v1/sessions/{sid}/control").status_code == 200
    expect(card(page, sid).locator(".help")).to_be_hidden(timeout=TIMEOUT_MS)


# -- recordings -----------------------------------------------------------------------------


def test_replay_a_recording(
    quiet: Page, client: httpx.Client, session: dict[str, Any]
) -> None:
    page, sid = quiet, session["id"]
    stopped = client.post(f"/v1/sessions/{sid}/recording/stop")
    assert stopped.status_code == 200, stopped.text
    recording = stopped.json()
    assert recording["state"] == "stopped" and recording["actions"] >= 1, recording

    row = page.locator(f'#recording-rows tr[data-id="{sid}"]')
    expect(row.locator("td.col-state")).to_have_text(re.compile("^stopped"), timeout=TIMEOUT_MS)
    row.locator("a.replay").click()
    page.wait_for_url(f"**/replay?session={sid}")
    clicks = page.locator("#steps li.action", has_text=f"click ({CLICK[0]}, {CLICK[1]})")
    expect(clicks).to_have_count(1, timeout=TIMEOUT_MS)
    expect(clicks.locator(".who")).to_have_text("agent")
    expect(page.locator("#steps li.event", has_text="paused")).not_to_have_count(0)

    clicks.locator("button").click()
    expect(clicks).to_have_class(re.compile(r"\bcurrent\b"))
    wait_for(page, _FRAME_LOADED)
    shown = page.evaluate(_FRAME_AND_MARKER, list(CLICK))
    assert shown["natural"] == [DISPLAY["width"], DISPLAY["height"]], shown
    assert near(shown["pixel"], (208, 0, 0)), shown  # the frame after the click: red
    left, top, width, height = shown["box"]
    assert width < DISPLAY["width"]  # scaled down to the page, so the marker is scaled too
    expected = (left + CLICK[0] * width / DISPLAY["width"],
                top + CLICK[1] * height / DISPLAY["height"])
    assert abs(shown["mark"][0] - expected[0]) <= 2 and abs(shown["mark"][1] - expected[1]) <= 2, (
        shown, expected)

    # Stepping and playing move the selection; the export downloads with the key.
    current = page.locator("#steps li.current")
    index = int(clicks.get_attribute("data-index") or -1)
    page.click("#next")
    expect(current).to_have_attribute("data-index", str(index + 1))
    expect(page.locator("#slider")).to_have_value(str(index + 1))
    page.click("#first")
    expect(current).to_have_attribute("data-index", "0")
    page.click("#play")
    expect(page.locator("#play")).to_have_text("Pause")
    # Past the second step: a step lasts 0.3 s or more, and expect's polls, backing off to
    # 1 s apart, saw the selection go from 1 to 3 once.
    expect(current).to_have_attribute("data-index", re.compile(r"^([2-9]|[1-9]\d+)$"),
                                      timeout=TIMEOUT_MS)
    page.click("#play")
    expect(page.locator("#play")).to_have_text("Play")
    with page.expect_download(timeout=TIMEOUT_MS) as download:
        page.click("#export")
    assert download.value.suggested_filename == f"{sid}.zip"
    path = download.value.path()
    with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as archive:
        assert "trajectory.jsonl" in archive.namelist()
