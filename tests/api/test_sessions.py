"""Session lifecycle over HTTP: create, get, list, keepalive, delete, idle expiry, caps."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

from deskbox_server.api.auth import key_id
from deskbox_server.schemas.sessions import SessionCreate, SessionState
from deskbox_server.scratch import scratch_prefix
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.registry import Registry
from deskbox_server.settings import Settings

from .conftest import KEY_A, Server, running_server
from .helpers import assert_error

SMALL = {"width": 640, "height": 400}


def wait_state(client: httpx.Client, session_id: str, state: str, timeout_s: float = 30) -> Any:
    deadline = time.monotonic() + timeout_s
    while (body := client.get(f"/v1/sessions/{session_id}").json())["state"] != state:
        assert time.monotonic() < deadline, f"session stayed {body['state']}, not {state}"
        time.sleep(0.05)
    return body


def test_session_resource(session: dict[str, Any]) -> None:
    assert session["id"].startswith("ses_")
    assert session["state"] == "running"
    assert session["backend"] == "local"
    assert session["display"] == {"width": 1280, "height": 800, "dpi": 96}
    assert session["failure"] is None
    assert session["created_at"].endswith("Z") and session["expires_at"].endswith("Z")
    assert session["timeout_s"] == 900
    urls = session["urls"]
    assert set(urls) == {"actions_ws", "vnc_ws", "view", "cdp_http", "cdp_ws"}
    assert urls["actions_ws"].startswith("ws://127.0.0.1:")
    assert urls["actions_ws"].endswith(f"/v1/sessions/{session['id']}/actions/ws")


def test_lifecycle(client: httpx.Client, session: dict[str, Any]) -> None:
    response = client.post(
        "/v1/sessions", json={"display": SMALL, "labels": {"team": "qa", "run": "1"}}
    )
    assert response.status_code == 201, response.text
    created = response.json()
    sid = created["id"]
    try:
        assert created["state"] == "running"
        assert created["display"]["width"] == 640
        assert client.get(f"/v1/sessions/{sid}").json()["labels"] == {"team": "qa", "run": "1"}

        def listed(**params: Any) -> list[str]:
            response = client.get("/v1/sessions", params=params)
            assert response.status_code == 200, response.text
            return [s["id"] for s in response.json()["sessions"]]

        assert {sid, session["id"]} <= set(listed())
        assert listed(label="team:qa") == [sid]
        assert listed(label=["team:qa", "run:1"]) == [sid]
        assert listed(label="team:dev") == []
        assert sid in listed(state="running")
        assert sid not in listed(state="stopped")
        assert_error(client.get("/v1/sessions", params={"label": "nocolon"}), 422,
                     "invalid_request")
        assert_error(client.get("/v1/sessions", params={"state": "dancing"}), 422,
                     "invalid_request")

        before = created["expires_at"]
        time.sleep(0.05)
        kept = client.post(f"/v1/sessions/{sid}/keepalive")
        assert kept.status_code == 200, kept.text
        assert kept.json()["expires_at"] > before
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    stopped = client.get(f"/v1/sessions/{sid}").json()
    assert stopped["state"] == "stopped"
    assert stopped["expires_at"] is None
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204  # idempotent
    assert sid in listed(state="stopped")
    assert_error(client.post(f"/v1/sessions/{sid}/keepalive"), 404, "not_found")
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json={"type": "screen_size"}),
                 404, "not_found")
    assert_error(client.get(f"/v1/sessions/{sid}/screenshot"), 404, "not_found")
    assert_error(client.delete("/v1/sessions/ses_never_seen"), 404, "not_found")
    assert_error(client.get("/v1/sessions/ses_never_seen"), 404, "not_found")


def test_no_wait_then_idle_expiry(client: httpx.Client) -> None:
    response = client.post(
        "/v1/sessions", params={"wait": "false"}, json={"display": SMALL, "timeout_s": 1}
    )
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    try:
        assert response.json()["state"] == "starting"
        assert_error(client.post(f"/v1/sessions/{sid}/actions", json={"type": "screen_size"}),
                     409, "conflict")
        running = wait_state(client, sid, "running")
        assert running["timeout_s"] == 1
        # The reaper (every 0.2 s in this suite) stops it once idle for a second.
        wait_state(client, sid, "stopped", timeout_s=15)
    finally:
        client.delete(f"/v1/sessions/{sid}")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"colour": "blue"}, "colour"),
        ({"display": {"width": 1280, "depth": 24}}, "depth"),
        ({"display": {"width": "wide"}}, "display.width"),
        ({"browser": {"start_url": "javascript:alert(1)"}}, "start_url"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"backend": "vm"}, "not available"),
        # The local engine declares no capability and only egress "all" (engines/base.py).
        ({"network": {"egress": "allowlist", "allow": ["example.org"]}},
         "network egress 'allowlist' needs that egress mode, which the local engine lacks; "
         "it offers 'all'"),
        ({"network": {"egress": "none"}}, "network egress 'none' needs"),
        ({"resources": {"cpus": 1}},
         "resources needs the capability 'resources', which the local engine lacks"),
        ({"runtime_class": "gvisor"}, "runtime_class needs runtime classes, which the local "
         "engine lacks; the kubernetes backend has them"),
        ({"runtime_class": "Not_A_Name"}, "runtime_class"),
    ],
)
def test_create_refuses_what_it_cannot_do(
    client: httpx.Client, body: dict[str, Any], words: str
) -> None:
    error = assert_error(client.post("/v1/sessions", json=body), 422, "invalid_request")
    assert words in error["message"]


def test_create_from_an_unknown_snapshot_is_404(client: httpx.Client) -> None:
    error = assert_error(client.post("/v1/sessions", json={"from_snapshot": "snap_1"}),
                         404, "not_found")
    assert "no snapshot" in error["message"]


def test_seeded_state_dir_caps_and_generated_key(tmp_path: Path) -> None:
    """A server without keys makes one (0600); leftovers of a dead server are failed; caps."""
    state_dir = tmp_path / "state"
    body = SessionCreate(labels={"left": "over"})
    leftover = SessionRecord(id="ses_leftover", owner="", backend="local", body=body,
                             timeout_s=900, state=SessionState.running)
    key_file = state_dir / "api_key"

    async def seed() -> None:
        registry = Registry(state_dir / "sessions.sqlite3")
        await registry.open()
        await registry.save(leftover)
        await registry.close()

    state_dir.mkdir()
    key_file.write_text("seeded-key\n")
    os.chmod(key_file, 0o600)
    leftover.owner = key_id("seeded-key")
    asyncio.run(seed())
    settings = Settings(state_dir=state_dir, api_keys=[], max_sessions=0, backends=["local"],
                        default_backend="local")
    with running_server(settings) as server, server.client("seeded-key") as http:
        failed = http.get("/v1/sessions/ses_leftover").json()
        assert failed["state"] == "failed"
        # The local engine declares no "adopt": nothing is tried, and the reason says why.
        assert failed["failure"]["reason"] == (
            "the server restarted, and the local engine's sandboxes end with it")
        response = http.post("/v1/sessions", json={})
        assert_error(response, 429, "capacity")
        assert int(response.headers["retry-after"]) > 0

    fresh = tmp_path / "fresh"
    fresh_settings = Settings(state_dir=fresh, api_keys=[], max_sessions=0, backends=["local"],
                              default_backend="local")
    with running_server(fresh_settings) as server:
        key_path = fresh / "api_key"
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        key = key_path.read_text().strip()
        assert server.services.keyring.generated_path == key_path
        with server.client(key) as http:
            assert http.get("/v1/sessions").json() == {"sessions": [], "next_cursor": None}


def test_per_key_cap(server: Server, session: dict[str, Any]) -> None:
    manager = server.services.manager
    limit = server.settings.max_sessions_per_key
    # Lower the cap to what this key already runs: the next create must be refused at once.
    server.settings.max_sessions_per_key = 1
    try:
        with server.client() as http:
            response = http.post("/v1/sessions", json={})
            error = assert_error(response, 429, "capacity")
            assert "API key" in error["message"]
            assert response.headers["retry-after"]
    finally:
        server.settings.max_sessions_per_key = limit
    assert manager.counts_by_state()["running"] >= 1



def test_a_dead_desktop_fails_its_session(server: Server, client: httpx.Client) -> None:
    response = client.post("/v1/sessions", json={"display": SMALL})
    assert response.status_code == 201, response.text
    sid = response.json()["id"]
    try:
        local = server.handle(sid).sandbox
        browser = next(c.popen for c in local.processes.children if c.name == "chromium")
        browser.kill()
        failed = wait_state(client, sid, "failed", timeout_s=15)
        assert "chromium" in failed["failure"]["reason"]
        assert failed["failure"]["at"].endswith("Z")
        error = assert_error(
            client.post(f"/v1/sessions/{sid}/actions", json={"type": "screen_size"}),
            502, "session_failed",
        )
        assert "chromium" in error["message"]
        assert sid in [s["id"] for s in client.get("/v1/sessions?state=failed").json()["sessions"]]
    finally:
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    assert client.get(f"/v1/sessions/{sid}").json()["state"] == "failed"
    # Once its desktop is gone too, acting on it still says why.
    error = assert_error(
        client.post(f"/v1/sessions/{sid}/actions", json={"type": "screen_size"}),
        502, "session_failed",
    )
    assert "chromium" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("POST", "pause", {"mode": "freeze"},
         "pause mode \"freeze\" needs the capability 'freeze', which the local engine lacks"),
        ("POST", "pause", {"mode": "hibernate"},
         "pause mode \"hibernate\" needs the capability 'checkpoint', which the local engine "
         "lacks"),
        ("POST", "snapshots", {},
         "snapshots and forks needs the capability 'checkpoint', which the local engine lacks"),
        ("POST", "fork", {"count": 2},
         "snapshots and forks needs the capability 'checkpoint', which the local engine lacks"),
        ("POST", "exec", {"cmd": ["true"]},
         "exec needs the capability 'exec', which the local engine lacks"),
    ],
)
def test_what_the_engine_lacks_is_refused_by_name_and_the_session_runs_on(
    client: httpx.Client, session: dict[str, Any], method: str, path: str,
    body: dict[str, Any], words: str,
) -> None:
    """The local engine declares no capability (engines/base.py): each request that needs
    one is a 422 naming it and what to use instead, and the session is untouched: refused
    before anything changed (a refused hibernate, snapshot or fork once closed every
    DevTools connection first, and a refused pause showed the session paused meanwhile)."""
    headers = {"Authorization": f"Bearer {KEY_A}"}
    with connect(session["urls"]["cdp_ws"], additional_headers=headers,
                 open_timeout=10) as devtools:
        response = client.request(method, f"/v1/sessions/{session['id']}/{path}", json=body)
        message = assert_error(response, 422, "invalid_request")["message"]
        assert words in message and "use the container engine" in message
        devtools.send(json.dumps({"id": 1, "method": "Browser.getVersion"}))
        assert json.loads(devtools.recv(timeout=10))["id"] == 1  # still connected
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "running"
    assert "paused" not in _states_so_far(client, session)  # not even meanwhile


def _states_so_far(client: httpx.Client, session: dict[str, Any]) -> list[str]:
    """The states of the session's event history (its stream, read until it waits)."""
    states: list[str] = []
    try:
        with client.stream("GET", f"/v1/sessions/{session['id']}/events",
                           timeout=httpx.Timeout(10, read=1)) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[len("data: "):])
                    if event["type"] == "state":
                        states.append(event["state"])
    except httpx.ReadTimeout:
        pass
    assert states[:2] == ["starting", "running"], states
    return states
    shot = client.post(f"/v1/sessions/{session['id']}/actions", json={"type": "screen_size"})
    assert shot.status_code == 200, shot.text


def test_a_server_whose_engines_cannot_fork_makes_no_fork_scratch(server: Server) -> None:
    """The local engine checkpoints nothing: no scratch directory for forks in /dev/shm."""
    prefix = scratch_prefix(server.settings.state_dir, "fork")
    assert Path(server.settings.scratch_dir).is_dir()
    assert not list(Path(server.settings.scratch_dir).glob(prefix + "*"))


def test_a_call_cut_short_by_a_delete_is_a_409_not_a_failure(
    server: Server, client: httpx.Client,
) -> None:
    """An action in flight when its session is deleted answers 409 `conflict`: it used to
    be a 502 `session_failed` about the agent's stream, for a session that ends `stopped`."""
    created = client.post("/v1/sessions", json={"display": {"width": 320, "height": 240}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    answers: list[httpx.Response] = []

    def wait_long() -> None:
        with server.client() as own:
            answers.append(own.post(f"/v1/sessions/{sid}/actions",
                                    json={"type": "wait", "ms": 5000}))

    waiting = threading.Thread(target=wait_long)
    waiting.start()
    time.sleep(0.5)
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    waiting.join(30)
    [answer] = answers
    message = assert_error(answer, 409, "conflict")["message"]
    assert f"session {sid} was stopped while the call ran" in message
    ended = client.get(f"/v1/sessions/{sid}").json()
    assert (ended["state"], ended["failure"]) == ("stopped", None)
