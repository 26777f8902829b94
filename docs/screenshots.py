"""The README's pictures of the web console: docs/img/console.png and docs/img/replay.png.

    .venv/bin/python docs/screenshots.py                    # a server of its own (root, runc)
    .venv/bin/python docs/screenshots.py --url URL --key KEY  # or a running one

Real sessions on a real server: without ``--url`` it starts ``deskbox serve`` on a free
loopback port with a temporary state dir (and the session image the tests use, see
tests/images.py), and stops it at the end. It makes three desktops (one recorded while an
"agent" fills in a form, one asking for help, one paused), photographs the console and the
recording's replay in a headless Chromium (the system's, through Playwright), then deletes
what it made.
"""

from __future__ import annotations

import argparse
import base64
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Page, Playwright, expect, sync_playwright

from deskbox.pixels import ScreenPoint, screen_point

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
DISPLAY = {"width": 1280, "height": 800}

_STYLE = """<meta charset="utf-8"><style>
body { margin: 0; font: 16px system-ui, sans-serif; color: #1d2433; background: #f4f6fb; }
header { padding: 18px 32px; color: #fff; font-size: 22px; font-weight: 600; }
main { max-width: 620px; margin: 40px auto; padding: 28px 32px; background: #fff;
  border-radius: 10px; box-shadow: 0 2px 10px rgba(0,0,0,.12); }
label { display: block; margin: 14px 0 4px; font-weight: 600; }
input { width: 100%; box-sizing: border-box; padding: 10px; font-size: 16px;
  border: 1px solid #b8c0d0; border-radius: 6px; }
button { margin-top: 22px; padding: 11px 26px; font-size: 16px; color: #fff;
  border: 0; border-radius: 6px; }
li { margin: 8px 0; }
</style>"""

# The recorded desktop: a form the "agent" fills in and sends.
FLIGHTS = _STYLE + """<header style="background:#1f5fd6">Acme Travel</header><main>
<h2>Search flights</h2>
<label>From</label><input id="from" placeholder="City or airport">
<label>To</label><input id="to" placeholder="City or airport">
<button style="background:#1f5fd6" onclick="document.getElementById('found').hidden=false">
Search</button>
<ol id="found" hidden><li>LIS → HND · 07:40 · 1 stop · €612</li>
<li>LIS → NRT · 11:05 · 1 stop · €655</li><li>LIS → HND · 21:30 · 2 stops · €540</li></ol>
</main>"""
CAPTCHA = _STYLE + """<header style="background:#0f8a5f">Green Grocer · checkout</header><main>
<h2>Verify that you are human</h2><p>Select every square with a traffic light.</p>
<div style="display:grid;grid-template-columns:repeat(3,90px);gap:6px">""" + "".join(
    f'<div style="height:90px;background:hsl({i * 37 % 360},45%,62%)"></div>' for i in range(9)
) + """</div><button style="background:#0f8a5f">Verify</button></main>"""
REPORT = _STYLE + """<header style="background:#7a3fd1">Quarterly report</header><main>
<h2>Q3 summary</h2><p>Revenue grew 14% over the quarter, led by the new subscription plan.
Churn fell to 2.1%.</p><label>Notes</label><input value="Draft: check the EU figures">
</main>"""


def data_url(html: str) -> str:
    return "data:text/html;base64," + base64.b64encode(html.encode()).decode()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def own_server() -> Iterator[tuple[str, str]]:
    """``deskbox serve`` on loopback with a temporary state dir; yields (url, key)."""
    key = "dbx-docs-" + secrets.token_urlsafe(24)
    port = free_port()
    state = tempfile.mkdtemp(prefix="deskbox-docs-")
    shared_cache = Path("/var/cache/deskbox")
    env = {**os.environ, "DESKBOX_API_KEYS": key}
    env.setdefault("DESKBOX_IMAGE_STATE_DIR",
                   str(shared_cache if shared_cache.is_dir() else REPO / ".state"))
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "deskbox"), "serve", "--host", "127.0.0.1",
         "--port", str(port), "--state-dir", state],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900  # a first start builds the session image
        while True:
            if process.poll() is not None:
                raise SystemExit(f"deskbox serve exited: {process.stderr.read().decode()[-2000:]}"
                                 if process.stderr else "deskbox serve exited")
            with suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("deskbox serve did not start")
            time.sleep(0.3)
        yield url, key
    finally:
        process.send_signal(signal.SIGTERM)  # it stops every session it runs
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(state, ignore_errors=True)


def create(api: httpx.Client, html: str, **body: Any) -> str:
    response = api.post("/v1/sessions", json={
        "display": DISPLAY, "browser": {"start_url": data_url(html)}, **body})
    response.raise_for_status()
    session_id: str = response.json()["id"]
    return session_id


def act(api: httpx.Client, session_id: str, *actions: dict[str, Any]) -> None:
    api.post(f"/v1/sessions/{session_id}/actions",
             json={"actions": list(actions)}).raise_for_status()


def sign_in(page: Page, url: str, key: str) -> None:
    page.goto(url + "/")
    page.fill("#key", key)
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#app")).to_be_visible()


def field_points(playwright: Playwright, api: httpx.Client, session_id: str
                 ) -> dict[str, ScreenPoint]:
    """Where the form's parts are on screen, asked of the session's own browser (CDP)."""
    token = api.post(f"/v1/sessions/{session_id}/tokens", json={"scope": "cdp"})
    token.raise_for_status()
    base = str(api.base_url).rstrip("/")
    cdp = f"{base}/v1/sessions/{session_id}/cdp?token={token.json()['token']}"
    browser = playwright.chromium.connect_over_cdp(cdp)
    try:
        page = browser.contexts[0].pages[0]
        return {name: screen_point(page, name) for name in ("#from", "#to", "button")}
    finally:
        browser.close()  # lets go of it; the session's browser runs on


def shoot(url: str, key: str) -> None:
    made: list[str] = []
    scratch = tempfile.mkdtemp(prefix="dbx-docs-chromium-")
    with (httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                       timeout=120) as api, sync_playwright() as playwright):
        try:
            recorded = create(api, FLIGHTS, record=True, labels={"agent": "travel"})
            made.append(recorded)
            stuck = create(api, CAPTCHA, labels={"agent": "shopping"})
            made.append(stuck)
            paused = create(api, REPORT, labels={"agent": "reports"})
            made.append(paused)
            points = field_points(playwright, api, recorded)
            for field, text in (("#from", "Lisbon"), ("#to", "Tokyo")):
                act(api, recorded, {"type": "click", "x": points[field].x, "y": points[field].y},
                    {"type": "type", "text": text}, {"type": "wait", "ms": 400})
            act(api, recorded, {"type": "click", "x": points["button"].x,
                                "y": points["button"].y}, {"type": "wait", "ms": 800})
            api.post(f"/v1/sessions/{stuck}/handoff",
                     json={"reason": "a captcha at checkout"}).raise_for_status()
            api.post(f"/v1/sessions/{paused}/pause", json={"mode": "freeze"}).raise_for_status()
            api.post(f"/v1/sessions/{recorded}/recording/stop").raise_for_status()

            OUT.mkdir(parents=True, exist_ok=True)
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=["--disable-gpu", "--disable-dev-shm-usage"],
                env={**os.environ, "TMPDIR": scratch})
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                sign_in(page, url, key)
                expect(page.locator(".card")).to_have_count(3, timeout=30_000)
                expect(page.locator("#recordings")).to_be_visible(timeout=30_000)
                page.wait_for_timeout(4500)  # two polls: every thumbnail is in
                page.screenshot(path=str(OUT / "console.png"))
                page.goto(f"{url}/replay?session={recorded}")
                clicks = page.locator("#steps li.action", has_text="click")
                expect(clicks.last).to_be_visible(timeout=30_000)
                clicks.last.locator("button").click()
                expect(page.locator("#marker")).to_be_visible(timeout=30_000)
                page.wait_for_timeout(500)
                page.screenshot(path=str(OUT / "replay.png"))
            finally:
                browser.close()
        finally:
            for session_id in made:
                api.delete(f"/v1/sessions/{session_id}")
            if made:
                api.delete(f"/v1/sessions/{made[0]}/recording")
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"wrote {OUT / 'console.png'} and {OUT / 'replay.png'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--key", help="its API key (with --url)")
    args = parser.parse_args()
    if args.url:
        if not args.key:
            parser.error("--url needs --key")
        shoot(args.url.rstrip("/"), args.key)
        return
    with own_server() as (url, key):
        shoot(url, key)


if __name__ == "__main__":
    main()
