"""Secrets end to end: a real server, a real runc sandbox, the browser's real focus.

A secret goes in once and never comes out: no answer, log line, event, error body or file
of the state dir holds its value. It is typed only into a focused field of a page of its
allowed origins (two local origins here: two ports of the sandbox's loopback), through the
API's ``type`` or a vendor dialect's ``{{secret:NAME}}``, and given to one command as an
environment variable.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from deskbox import Deskbox, cdp
from deskbox_server.sessions import secrets as secrets_store
from deskbox_server.settings import Settings

from ..images import IMAGE_STATE_DIR, session_image
from .conftest import DISPLAY, KEY_A, KEY_B, Server, running_server
from .helpers import assert_error

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VALUE = "hunter2-Zq8#secret-value"
GOOD, EVIL = "http://127.0.0.1:8000", "http://127.0.0.1:8001"
# The field fills the page: a click anywhere on the page is a click in it.
LOGIN = ("<title>login</title><input id=pw type=password "
         "style='position:fixed;left:0;top:0;width:100%;height:100%'>")
CLICK_FIELD = {"type": "click", "x": 640, "y": 500}


class Recorder(httpx.Client):
    """An API client that keeps every answer's text, to look for the value in them."""

    answers: list[str]

    def request(self, *args: Any, **kwargs: Any) -> httpx.Response:  # type: ignore[override]
        response = super().request(*args, **kwargs)
        self.answers.append(response.text + repr(dict(response.headers)))
        return response


@pytest.fixture(scope="module")
def secret_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()
    settings = Settings(state_dir=tmp_path_factory.mktemp("secrets-state"),
                        api_keys=[KEY_A, KEY_B], image_state_dir=IMAGE_STATE_DIR)
    with running_server(settings) as running:
        yield running


@pytest.fixture
def client(secret_server: Server) -> Iterator[Recorder]:
    with Recorder(base_url=secret_server.url, timeout=60,
                  headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        http.answers = []
        yield http
        for session in http.get("/v1/sessions").json()["sessions"]:
            http.delete(f"/v1/sessions/{session['id']}")
        for secret in http.get("/v1/secrets").json()["secrets"]:
            http.delete(f"/v1/secrets/{secret['name']}")


def store_secret(client: httpx.Client, name: str = "PW") -> None:
    response = client.post("/v1/secrets", json={
        "name": name, "value": VALUE, "allowed_origins": [GOOD + "/"]})
    assert response.status_code == 201, response.text
    assert response.json()["allowed_origins"] == [GOOD]  # normalised


def run(client: httpx.Client, session_id: str, cmd: list[str], **extra: Any) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{session_id}/exec",
                           json={"cmd": cmd, "timeout_s": 30, **extra})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def serve_origins(client: httpx.Client, session_id: str) -> None:
    """The login page on two origins of the sandbox's loopback (ports 8000 and 8001)."""
    assert run(client, session_id, ["mkdir", "-p", "/tmp/site"])["exit_code"] == 0
    site_page(client, session_id, "login.html", LOGIN)
    for port in ("8000", "8001"):
        run(client, session_id, ["python3", "-m", "http.server", port, "--bind", "127.0.0.1",
                                 "--directory", "/tmp/site"], background=True)
    for port in ("8000", "8001"):
        assert run(client, session_id, ["sh", "-c", "for i in $(seq 50); do python3 -c "
                   f"\"import urllib.request;urllib.request.urlopen('http://127.0.0.1:{port}/')\""
                   " 2>/dev/null && exit 0; sleep 0.1; done; exit 1"])["exit_code"] == 0


def site_page(client: httpx.Client, session_id: str, name: str, html: str) -> None:
    """``html`` as /``name`` of both origins (serve_origins)."""
    assert run(client, session_id, ["sh", "-c", 'printf %s "$1" > "/tmp/site/$0"', name, html]
               )["exit_code"] == 0


def focusing_late(client: httpx.Client, name: str, delay_ms: int) -> str:
    """A new session with the secret stored and the login page served as ``name``, its
    field focused by the page itself ``delay_ms`` after the mousedown (which keeps the
    browser from focusing it at once); the session's id."""
    store_secret(client)
    sid = str(client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"])
    serve_origins(client, sid)
    site_page(client, sid, name, LOGIN.replace(
        "<input ", "<input onmousedown='event.preventDefault(); "
        f"setTimeout(() => this.focus(), {delay_ms})' "))
    return sid


def until_listed(client: httpx.Client, session_id: str, text: str, what: str,
                 listed: bool = True) -> None:
    """Until the browser's targets name ``text`` (or, ``listed`` False, no longer do)."""
    deadline = time.monotonic() + 10
    while (text in json.dumps(client.get(f"/v1/sessions/{session_id}/cdp/json/list").json())
           ) is not listed:
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_secret_is_stored_never_shown_and_the_keys_own(
    client: Recorder, secret_server: Server
) -> None:
    store_secret(client)
    assert_error(client.post("/v1/secrets", json={
        "name": "PW", "value": VALUE, "allowed_origins": [GOOD]}), 409, "conflict")
    listed = client.get("/v1/secrets").json()["secrets"]
    assert [(s["name"], s["allowed_origins"]) for s in listed] == [("PW", [GOOD])]
    assert set(client.get("/v1/secrets/PW").json()) == {"name", "allowed_origins", "created_at"}
    for bad in ({"name": "1PW", "value": VALUE, "allowed_origins": [GOOD]},
                {"name": "X", "value": VALUE, "allowed_origins": ["github.com"]},
                {"name": "X", "value": VALUE, "allowed_origins": [GOOD + "/login"]},
                {"name": "X", "value": VALUE, "allowed_origins": []},
                {"name": "X", "value": "", "allowed_origins": [GOOD]},
                {"name": "X", "value": VALUE, "allowed_origins": [GOOD], "extra": VALUE}):
        assert_error(client.post("/v1/secrets", json=bad), 422, "invalid_request")
    assert_error(client.get("/v1/secrets/NOPE"), 404, "not_found")
    with httpx.Client(base_url=secret_server.url,
                      headers={"Authorization": f"Bearer {KEY_B}"}) as other:
        assert other.get("/v1/secrets").json()["secrets"] == []
        assert_error(other.get("/v1/secrets/PW"), 404, "not_found")
        assert_error(other.delete("/v1/secrets/PW"), 404, "not_found")
    assert all(VALUE not in answer for answer in client.answers)
    assert client.delete("/v1/secrets/PW").status_code == 204
    assert client.get("/v1/secrets").json()["secrets"] == []


def test_a_keys_secrets_stop_at_its_quota(
    client: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the most secrets a key may hold, a create is a 429 ``quota_exceeded`` without a
    Retry-After (waiting frees nothing), and a delete makes room again."""
    monkeypatch.setattr(secrets_store, "_MAX_PER_KEY", 2)  # 256 as shipped
    for name in ("A", "B"):
        store_secret(client, name)
    refused = client.post("/v1/secrets", json={
        "name": "C", "value": VALUE, "allowed_origins": [GOOD]})
    assert "2 secrets" in assert_error(refused, 429, "quota_exceeded")["message"]
    assert "retry-after" not in refused.headers
    assert client.delete("/v1/secrets/A").status_code == 204
    store_secret(client, "C")


def test_creates_of_one_name_at_once_make_one_secret(
    client: Recorder, secret_server: Server,
) -> None:
    """Each found no secret of that name and each answered 201, the last replacing the
    others (API.md: 409 for a name in use); their records' writes shared one temporary
    file, which could be renamed into place cut, leaving the key's secrets unreadable."""
    together = threading.Barrier(6)
    statuses: list[int] = []

    def create(index: int) -> None:
        with secret_server.client(KEY_A) as own:
            together.wait()
            statuses.append(own.post("/v1/secrets", json={
                "name": "ONCE", "value": VALUE + "x" * index * 50,
                "allowed_origins": [GOOD]}).status_code)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(statuses) == [201, 409, 409, 409, 409, 409], statuses
    assert [s["name"] for s in client.get("/v1/secrets").json()["secrets"]] == ["ONCE"]


def test_a_secret_is_typed_only_where_its_origin_has_the_focus(
    client: Recorder, secret_server: Server, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    store_secret(client)
    # Recorded: the recording keeps each secret's name, never its value.
    session = client.post("/v1/sessions", json={"display": DISPLAY, "record": True}).json()
    sid = session["id"]
    serve_origins(client, sid)
    with Deskbox(secret_server.url, KEY_A) as box:
        handle = box.sessions.get(sid)
        field = "document.getElementById('pw').value"

        cdp.navigate(handle, f"{GOOD}/login.html")
        typed = client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [CLICK_FIELD, {"type": "type", "secret": "PW"}]})
        assert typed.status_code == 200, typed.text
        assert cdp.evaluate(handle, field) == VALUE

        # Another origin, as a prompt-injected page would have it: refused, nothing typed.
        cdp.navigate(handle, f"{EVIL}/login.html")
        assert client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [CLICK_FIELD]}).status_code == 200
        error = assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "type", "secret": "PW"}]}), 403, "secret_origin_mismatch")
        assert EVIL in error["message"] and GOOD in error["message"]
        assert cdp.evaluate(handle, field) == ""
        # The same through the Anthropic dialect's placeholder.
        refused = client.post(f"/v1/sessions/{sid}/actions/anthropic",
                              json={"action": "type", "text": "{{secret:PW}}"})
        assert_error(refused, 403, "secret_origin_mismatch")
        assert cdp.evaluate(handle, field) == ""

        # The allowed origin, but the keyboard in the address bar: no page has the focus.
        cdp.navigate(handle, f"{GOOD}/login.html")
        assert client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "key", "keys": "ctrl+l"}]}).status_code == 200
        assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "type", "secret": "PW"}]}), 403, "secret_origin_mismatch")
        assert client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "key", "keys": "Escape"}, CLICK_FIELD]}).status_code == 200

        # The dialect's placeholder, in the field of the allowed origin, text around it.
        dialect = client.post(f"/v1/sessions/{sid}/actions/anthropic",
                              json={"action": "type", "text": "<{{secret:PW}}>"})
        assert dialect.status_code == 200, dialect.text
        assert cdp.evaluate(handle, field) == f"<{VALUE}>"
        assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "type", "secret": "NOPE"}]}), 404, "not_found")

    # Nothing held the value on the way: answers, events, the recording, log lines, the
    # state dir (the recording's files in it).
    client.delete(f"/v1/sessions/{sid}")
    events = client.get(f"/v1/sessions/{sid}/events", timeout=5).text
    assert "state" in events and VALUE not in events
    trajectory = client.get(f"/v1/sessions/{sid}/trajectory").text
    assert trajectory.count('"secret":"PW"') >= 5 and VALUE not in trajectory
    assert client.get(f"/v1/sessions/{sid}/trajectory.zip").status_code == 200
    assert all(VALUE not in answer for answer in client.answers)
    assert VALUE not in caplog.text
    state_dir = secret_server.settings.state_dir
    for path in Path(state_dir).rglob("*"):
        if path.is_file():
            assert VALUE.encode() not in path.read_bytes(), path


def test_a_field_that_takes_the_focus_late_gets_the_secret(
    client: Recorder, secret_server: Server
) -> None:
    """The browser may take the focus a moment after the click (here the page focuses the
    field itself 400 ms later): the check asks again before it refuses."""
    sid = focusing_late(client, "late.html", 400)
    with Deskbox(secret_server.url, KEY_A) as box:
        handle = box.sessions.get(sid)
        cdp.navigate(handle, f"{GOOD}/late.html")
        typed = client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [CLICK_FIELD, {"type": "type", "secret": "PW"}]})
        assert typed.status_code == 200, typed.text
        assert cdp.evaluate(handle, "document.getElementById('pw').value") == VALUE


def test_a_pause_waits_for_a_secrets_focus_check(
    client: Recorder, secret_server: Server
) -> None:
    """A batch typing a secret is in flight from its focus check on: a pause sent during
    the check (here asked again until the page focuses its field 800 ms after the click)
    waits for the batch, as for any action in flight. Before, the check did not count as
    work in flight: the pause froze the browser under it, the batch was refused 403 as if
    no field had the focus, and a check that answered just before the freeze sent its
    keys to a frozen desktop, whose deadline failed the session."""
    sid = focusing_late(client, "later.html", 800)
    with Deskbox(secret_server.url, KEY_A) as box:
        handle = box.sessions.get(sid)
        cdp.navigate(handle, f"{GOOD}/later.html")
        answers: dict[str, tuple[httpx.Response, float]] = {}

        def pause() -> None:
            with secret_server.client(KEY_A) as own:
                own.timeout = httpx.Timeout(60)
                paused = own.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
                answers["pause"] = (paused, time.monotonic())

        pausing = threading.Timer(0.3, pause)
        pausing.start()
        typed = client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [CLICK_FIELD, {"type": "type", "secret": "PW"}]})
        typed_at = time.monotonic()
        pausing.join(60)
        assert typed.status_code == 200, typed.text
        paused, paused_at = answers["pause"]
        assert paused.status_code == 200, paused.text
        assert paused_at >= typed_at  # it waited for the batch
        resumed = client.post(f"/v1/sessions/{sid}/resume")
        assert resumed.status_code == 200, resumed.text
        assert cdp.evaluate(handle, "document.getElementById('pw').value") == VALUE

def test_a_frame_of_another_site_that_takes_the_focus_late_gets_no_secret(
    client: Recorder, secret_server: Server
) -> None:
    """A frame of another site (a renderer of its own) lies over the field, and its
    ``mousedown`` handler keeps that renderer busy for 1.5 s before the frame takes the
    focus: when the check asks the page, the page still says its field has it. The frame
    is asked too, which waits for its renderer: refused, nothing typed."""
    store_secret(client)
    sid = client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"]
    serve_origins(client, sid)
    full = "position:fixed;left:0;top:0;width:100%;height:100%;border:0"
    frame = (f"<input id=f style='{full}'><script>addEventListener('mousedown', () => "
             "{ const t = Date.now(); while (Date.now() - t < 1500) {} })</script>")
    page = (LOGIN.replace("<input ", "<input autofocus ")
            + f"<iframe src='http://localhost:8001/frame.html' style='{full}'></iframe>")
    site_page(client, sid, "frame.html", frame)
    site_page(client, sid, "framed.html", page)
    with Deskbox(secret_server.url, KEY_A) as box:
        handle = box.sessions.get(sid)
        cdp.navigate(handle, f"{GOOD}/framed.html")
        until_listed(client, sid, "localhost:8001", "the frame of another site never loaded")
        assert cdp.evaluate(handle, "document.activeElement.id") == "pw"
        refused = client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [CLICK_FIELD, {"type": "type", "secret": "PW"}]})
        error = assert_error(refused, 403, "secret_origin_mismatch")
        assert "a frame of another origin" in error["message"]
        assert error["action_index"] == 1  # the click before it was done
        assert cdp.evaluate(handle, "document.getElementById('pw').value") == ""


def test_a_stuck_frame_in_another_tab_keeps_no_secret_from_the_focused_page(
    client: Recorder, secret_server: Server
) -> None:
    """Only the focused page's frames are asked: a frame of another site stuck in a script
    in a background tab (it would never answer) does not refuse the field in front."""
    store_secret(client)
    sid = client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"]
    serve_origins(client, sid)
    stuck = "<script>setTimeout(() => { for (;;) {} }, 300)</script>"
    holder = "<iframe src='http://localhost:8001/stuck.html'></iframe>"
    site_page(client, sid, "stuck.html", stuck)
    site_page(client, sid, "holder.html", holder)
    with Deskbox(secret_server.url, KEY_A) as box:
        handle = box.sessions.get(sid)
        cdp.navigate(handle, f"{GOOD}/login.html")
        browser = client.get(f"/v1/sessions/{sid}/cdp/json/version").json()
        with connect(browser["webSocketDebuggerUrl"], open_timeout=10,
                     additional_headers={"Authorization": f"Bearer {KEY_A}"}) as devtools:
            devtools.send(json.dumps({"id": 1, "method": "Target.createTarget", "params": {
                "url": f"{GOOD}/holder.html", "background": True}}))
            holder_tab = json.loads(devtools.recv(timeout=10))["result"]["targetId"]
            until_listed(client, sid, "localhost:8001/stuck", "the stuck frame never loaded")
            time.sleep(0.5)  # its script has started
            typed = client.post(f"/v1/sessions/{sid}/actions", json={
                "actions": [CLICK_FIELD, {"type": "type", "secret": "PW"}]})
            assert typed.status_code == 200, typed.text
            devtools.send(json.dumps({"id": 2, "method": "Target.closeTarget", "params": {
                "targetId": holder_tab}}))
            devtools.recv(timeout=10)
        # Closed a moment after its close answers.
        until_listed(client, sid, holder_tab, "the background tab never closed", listed=False)
        assert cdp.evaluate(handle, "document.getElementById('pw').value") == VALUE


def test_a_page_stuck_in_a_script_is_refused_in_bounded_time(
    client: Recorder, secret_server: Server
) -> None:
    """The focus check asks the page: one that never answers is a 403 within seconds, and
    the session carries on."""
    store_secret(client)
    sid = client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"]
    serve_origins(client, sid)
    site_page(client, sid, "stuck.html",
              LOGIN + "<script>setTimeout(() => { for (;;) {} }, 300)</script>")
    with Deskbox(secret_server.url, KEY_A) as box:
        cdp.navigate(box.sessions.get(sid), f"{GOOD}/stuck.html")
    started = time.monotonic()
    error = assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
        "actions": [CLICK_FIELD, {"type": "wait", "ms": 500}, {"type": "type", "secret": "PW"}]}),
        403, "secret_origin_mismatch")
    assert error["action_index"] == 2
    assert time.monotonic() - started < 15
    shot = client.post(f"/v1/sessions/{sid}/actions", json={"actions": [{"type": "wait", "ms": 0}]})
    assert shot.status_code == 200


def test_a_command_gets_a_secret_in_its_environment_and_alone(client: Recorder) -> None:
    store_secret(client)
    sid = client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"]
    shown = run(client, sid, ["sh", "-c", f'test "$PW" = "{VALUE}" && echo "got $PW"'],
                secrets=["PW"])
    assert (shown["exit_code"], shown["stdout"]) == (0, "got [secret PW]\n"), shown
    other = run(client, sid, ["sh", "-c", 'echo "${PW:-unset}"; cat /proc/1/environ'])
    assert other["stdout"].startswith("unset\n") and VALUE not in other["stdout"]
    assert_error(client.post(f"/v1/sessions/{sid}/exec", json={
        "cmd": ["true"], "secrets": ["NOPE"]}), 404, "not_found")
    assert_error(client.post(f"/v1/sessions/{sid}/exec", json={
        "cmd": ["true"], "secrets": ["PW"], "env": {"PW": "x"}}), 422, "invalid_request")
    assert all(VALUE not in answer for answer in client.answers)


def test_output_cut_at_its_limit_in_a_secret_shows_none_of_it(client: Recorder) -> None:
    """The output limit fell inside the value: the whole value was never there to be
    replaced, and its first characters came back."""
    store_secret(client)
    sid = client.post("/v1/sessions", json={"display": DISPLAY}).json()["id"]
    limit = 1024 * 1024  # DESKBOX_EXEC_OUTPUT_MAX_BYTES's default
    shown = run(client, sid, ["sh", "-c", f'head -c {limit - 10} /dev/zero | tr "\\0" x; '
                              'printf %s "$PW"'], secrets=["PW"])
    assert shown["stdout_truncated"], {k: v for k, v in shown.items() if k != "stdout"}
    assert shown["stdout"].endswith("x[secret PW]"), shown["stdout"][-40:]
    assert VALUE[:4] not in shown["stdout"]


def test_the_sdk_stores_lists_and_uses_secrets(secret_server: Server) -> None:
    with Deskbox(secret_server.url, KEY_A) as box:
        made = box.secrets.create("SDK_TOKEN", VALUE, [GOOD])
        assert made["name"] == "SDK_TOKEN" and VALUE not in repr(made)
        assert [s["name"] for s in box.secrets.list()] == ["SDK_TOKEN"]
        with box.sessions.create() as session:
            result = session.exec(f'test "$SDK_TOKEN" = "{VALUE}"', secrets=["SDK_TOKEN"])
            assert result.exit_code == 0
        box.secrets.delete("SDK_TOKEN")
        assert box.secrets.list() == []
