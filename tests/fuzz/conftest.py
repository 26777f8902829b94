"""A real server (local backend, uvicorn on loopback) and a live session, for fuzzing.

``DESKBOX_FUZZ_EXAMPLES`` is how many cases Schemathesis generates per operation (and how
many stateful scenarios it runs), ``DESKBOX_FUZZ_PHASES`` which of its phases run: a
bounded run in ``make test``, a long one with the coverage phase in ``make fuzz``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deskbox_server.settings import Settings

from ..api.conftest import DISPLAY, KEY_A, KEY_B, Server, running_server

__all__ = ["EXAMPLES", "PHASES"]

EXAMPLES = int(os.environ.get("DESKBOX_FUZZ_EXAMPLES", "12"))
PHASES = os.environ.get("DESKBOX_FUZZ_PHASES", "examples,fuzzing,stateful")


@pytest.fixture(scope="session")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("fuzz-state"),
        api_keys=[KEY_A, KEY_B],
        backends=["local"],
        default_backend="local",
        reaper_interval_s=0.5,
        # The live session and what the fuzzer creates; beyond that, 429 answers.
        max_sessions=4,
        max_sessions_per_key=3,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="session")
def fuzz_client(fuzz_server: Server) -> Iterator[httpx.Client]:
    with fuzz_server.client() as http:
        yield http


@pytest.fixture(scope="session")
def live_session(fuzz_client: httpx.Client) -> Iterator[dict[str, Any]]:
    """A running session (blank page) that about half the fuzzer's cases act on."""
    response = fuzz_client.post("/v1/sessions", json={"display": DISPLAY})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    try:
        yield body
    finally:
        fuzz_client.delete(f"/v1/sessions/{body['id']}")
