"""A container-backend server per attack module (state dir named after it, more settings
from the module's SERVER_SETTINGS) and a client of it with the key KEY_A and a timeout long
enough for checkpoints."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ..api.conftest import KEY_A, Server
from ..api.containers import container_server


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Server]:
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    # A module may set more of the server's settings in SERVER_SETTINGS.
    extra = getattr(request.module, "SERVER_SETTINGS", {})
    with container_server(tmp_path_factory, name, max_sessions=8,
                          max_sessions_per_key=8, **extra) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client(KEY_A) as http:
        http.timeout = httpx.Timeout(120)
        yield http
