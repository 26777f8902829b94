"""What both fault modules share: a client of the module's server (each module declares its
own ``server``), a session on a red page per test and a neighbour session per module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ..api.conftest import DISPLAY, Server

PAGE = "data:text/html,<body style='background:%23c33'><input id=f autofocus></body>"


def create(client: httpx.Client) -> dict[str, Any]:
    response = client.post("/v1/sessions", json={"display": DISPLAY,
                                                  "browser": {"start_url": PAGE}})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as http:
        http.timeout = httpx.Timeout(60)
        yield http


@pytest.fixture
def session(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = create(client)
    yield created
    client.delete(f"/v1/sessions/{created['id']}")


@pytest.fixture(scope="module")
def neighbour(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = create(client)
    yield created
    client.delete(f"/v1/sessions/{created['id']}")
