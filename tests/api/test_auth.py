"""Bearer keys: none or a wrong one is 401; another key's session does not exist (404)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deskbox_server.api.auth import load_keyring
from deskbox_server.settings import Settings

from .conftest import KEY_B, Server
from .helpers import assert_error


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "x"}])
def test_missing_or_wrong_key_is_401(server: Server, headers: dict[str, str]) -> None:
    with server.client(None) as http:
        for method, path in [("GET", "/v1/sessions"), ("POST", "/v1/sessions"),
                             ("GET", "/v1/sessions/ses_x"), ("DELETE", "/v1/sessions/ses_x")]:
            response = http.request(method, path, headers=headers)
            assert_error(response, 401, "unauthorized")
            assert response.headers["www-authenticate"] == "Bearer"


def test_healthz_needs_no_key(server: Server) -> None:
    with server.client(None) as http:
        response = http.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
    # The engines sessions may ask for, each with what it offers: this server's is local.
    assert response.json()["engines"] == {
        "local": {"capabilities": [], "egress": ["all"], "details": {}},
    }


def test_another_keys_session_is_not_found(server: Server, session: dict[str, Any]) -> None:
    session_id = session["id"]
    with server.client(KEY_B) as other:
        assert_error(other.get(f"/v1/sessions/{session_id}"), 404, "not_found")
        assert_error(other.delete(f"/v1/sessions/{session_id}"), 404, "not_found")
        assert_error(other.post(f"/v1/sessions/{session_id}/keepalive"), 404, "not_found")
        assert_error(
            other.post(f"/v1/sessions/{session_id}/actions", json={"type": "screen_size"}),
            404, "not_found",
        )
        assert_error(other.get(f"/v1/sessions/{session_id}/screenshot"), 404, "not_found")
        listed = other.get("/v1/sessions").json()["sessions"]
        assert session_id not in [s["id"] for s in listed]
    # Still there for its owner.
    with server.client() as owner:
        assert owner.get(f"/v1/sessions/{session_id}").json()["state"] == "running"


def test_websocket_needs_the_owners_key(server: Server, session: dict[str, Any]) -> None:
    url = server.ws_url(session["id"])
    for headers, status in [({}, 401), ({"Authorization": "Bearer nope"}, 401),
                            ({"Authorization": f"Bearer {KEY_B}"}, 404)]:
        with pytest.raises(InvalidStatus) as raised:
            connect(url, additional_headers=headers, open_timeout=10).close()
        response = raised.value.response
        assert response.status_code == status
        assert b'"request_id"' in response.body


def test_a_key_file_left_empty_by_a_killed_server_is_made_again(tmp_path: Path) -> None:
    """The first start wrote its key file after creating it: killed (or out of disk) in
    between, it left it empty, and every later start refused to run."""
    settings = Settings(state_dir=tmp_path / "state", api_keys=[])
    settings.api_key_path.parent.mkdir(parents=True)
    settings.api_key_path.write_text("")
    keyring = load_keyring(settings)
    key = settings.api_key_path.read_text().strip()
    assert key.startswith("dbx_") and keyring.identify(key) is not None
    assert load_keyring(settings).identify(key) is not None  # read back as it is
    assert stat.S_IMODE(settings.api_key_path.stat().st_mode) == 0o600
    assert [p.name for p in settings.api_key_path.parent.iterdir()] == [
        settings.api_key_path.name]
