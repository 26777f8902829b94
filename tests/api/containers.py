"""What the container-backend test modules share: a server, a session on the event page,
the sandbox behind it, and where the page sits on screen."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from deskbox_server.api.auth import key_id
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.sessions.desktop import AnyDesktop
from deskbox_server.settings import Settings

from ..images import IMAGE_STATE_DIR
from .conftest import DISPLAY, KEY_A, Server, running_server
from .sandbox_page import SandboxPage, events_data_url

__all__ = ["act", "container_server", "create_running", "open_session", "page_origin",
           "sandbox_handle", "sandbox_page"]


@contextmanager
def container_server(
    tmp_path_factory: pytest.TempPathFactory, name: str, **settings: Any
) -> Iterator[Server]:
    """A container-backend server with its own state dir, the key KEY_A and the shared image."""
    config = Settings(
        state_dir=tmp_path_factory.mktemp(f"{name}-state"),
        api_keys=[KEY_A],
        image_state_dir=IMAGE_STATE_DIR,
        **{"reaper_interval_s": 0.5, **settings},
    )
    with running_server(config) as running:
        yield running


@contextmanager
def open_session(client: httpx.Client, **body: Any) -> Iterator[dict[str, Any]]:
    """A session showing the event page (unless ``browser`` says otherwise); deleted after."""
    response = client.post(
        "/v1/sessions",
        json={"display": DISPLAY, "browser": {"start_url": events_data_url()}, **body},
    )
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    try:
        yield session
    finally:
        client.delete(f"/v1/sessions/{session['id']}")


def create_running(client: httpx.Client, **body: Any) -> dict[str, Any]:
    """A new session, checked to be running (the caller deletes it)."""
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    assert session["state"] == "running", session
    return session


def sandbox_handle(server: Server, session: dict[str, Any]) -> AnyDesktop:
    found = server.services.manager.handle(key_id(KEY_A), session["id"])
    assert isinstance(found.sandbox, RuncSandbox)
    return found


@contextmanager
def sandbox_page(client: httpx.Client, session: dict[str, Any]) -> Iterator[SandboxPage]:
    """The event page, read inside the sandbox (its exec API) once it has loaded."""
    with SandboxPage(client, session["id"]) as page:
        page.wait(lambda state: state["clicks"] == 0)
        yield page


def act(client: httpx.Client, session: dict[str, Any], body: dict[str, Any]) -> Any:
    response = client.post(f"/v1/sessions/{session['id']}/actions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def page_origin(
    client: httpx.Client, session: dict[str, Any], page: SandboxPage
) -> tuple[int, int]:
    """Where the page's (0, 0) is on screen, from one click through the API."""
    act(client, session, {"type": "click", "x": 640, "y": 700})
    click = page.wait(lambda state: state["clicks"] >= 1)["click"]
    return click[2] - click[0], click[3] - click[1]
