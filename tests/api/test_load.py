"""A short load run (bench/load.py's client, tests/load_client.py): 4 clients x 50 mixed
actions over 2 sessions at once, on a real server (local backend). Every reply must be
exactly what the protocol promises and no action may fail."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from deskbox_server.settings import Settings

from ..load_client import KINDS, TEXT_PAGE, run_load
from .conftest import DISPLAY, KEY_A, Server, running_server

CLIENTS, ACTIONS, SESSIONS = 4, 50, 2


@pytest.fixture(scope="module")
def load_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("load-state"),
        api_keys=[KEY_A],
        backends=["local"],
        default_backend="local",
    )
    with running_server(settings) as running:
        yield running


def test_clients_at_once_get_every_reply_right(load_server: Server) -> None:
    with load_server.client() as http:
        sessions: list[str] = []
        try:
            for _ in range(SESSIONS):
                response = http.post("/v1/sessions", json={
                    "display": DISPLAY, "browser": {"start_url": TEXT_PAGE},
                })
                assert response.status_code == 201, response.text
                sessions.append(response.json()["id"])
            result = asyncio.run(run_load(
                [load_server.ws_url(session_id) for session_id in sessions],
                {"Authorization": f"Bearer {KEY_A}"}, CLIENTS, ACTIONS,
                (DISPLAY["width"], DISPLAY["height"]), timeout_s=60,
            ))
        finally:
            for session_id in sessions:
                http.delete(f"/v1/sessions/{session_id}")
    assert result.errors == []
    assert result.actions == CLIENTS * ACTIONS
    assert all(result.latencies[kind] for kind in KINDS)
    # The sessions' workers took every action: the server's own count agrees.
    metrics = load_server.services.metrics
    assert sum(metrics.actions.value(kind, "ok") for kind in KINDS) == CLIENTS * ACTIONS
