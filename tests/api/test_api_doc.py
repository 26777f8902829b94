"""docs/API.md, the contract, names every route the server serves, and no route it doesn't.

The routes come from the app itself: the paths of its OpenAPI document (what clients and
the fuzzer see) and its websocket routes (which OpenAPI cannot describe).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from deskbox_server.app import create_app
from deskbox_server.settings import Settings

API_DOC = Path(__file__).parents[2] / "docs" / "API.md"

# The code names path parameters after what they hold; the contract calls a resource's own
# id `{id}`.
_PARAM_NAMES = {"{session_id}": "{id}", "{snapshot_id}": "{id}"}

# A path as the contract writes it: from a leading slash up to the first character that
# cannot be part of one (a backtick, a space, `?` of a query, punctuation after it).
_DOC_PATH = re.compile(r"(?<![\w}/.<>-])(/(?:v1/|healthz|metrics|openapi\.json)[\w{}/.-]*)")


def normalise(path: str) -> str:
    for code_name, doc_name in _PARAM_NAMES.items():
        path = path.replace(code_name, doc_name)
    return path


def _walk(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[tuple[str, BaseRoute]]:
    """Every route with its full path. FastAPI ≥ 0.160 keeps included routers as one
    entry each (``original_router``) instead of copying their routes into the app."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            context = getattr(route, "include_context", None)
            yield from _walk(included.routes, prefix + getattr(context, "prefix", ""))
        elif isinstance(route, Route | WebSocketRoute | Mount):
            yield prefix + route.path, route


def websocket_paths(app: FastAPI) -> set[str]:
    # The fallback for every other path serves nothing: it refuses (404).
    return {normalise(path) for path, route in _walk(app.routes)
            if isinstance(route, WebSocketRoute) and route.name != "no_such_websocket"}


def served_paths(app: FastAPI) -> set[str]:
    """Every path a request can name: the documented ones and the hidden aliases too."""
    return {normalise(path) for path, _ in _walk(app.routes)}


def documented_paths(text: str) -> set[str]:
    return {match.rstrip("./") or "/" for match in _DOC_PATH.findall(text)}


def missing_from(text: str, paths: Iterable[str], *, websocket: bool = False) -> list[str]:
    """The paths `text` does not name (websocket routes as ``WS /path``)."""
    named = documented_paths(text)
    if websocket:
        named = {p.rstrip("./") for p in re.findall(r"WS (/[\w{}/.-]*)", text)}
    return sorted(set(paths) - named)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    state = tmp_path_factory.mktemp("state")
    # No backends: building the app starts nothing (the lifespan does not run here).
    return create_app(Settings(state_dir=state, api_keys="test-key-doc"), engines={})


@pytest.fixture(scope="module")
def doc() -> str:
    return API_DOC.read_text(encoding="utf-8")


def test_every_openapi_path_is_in_the_contract(app: FastAPI, doc: str) -> None:
    paths = {normalise(path) for path in app.openapi()["paths"]}
    assert len(paths) >= 20, paths  # the document really was read
    assert missing_from(doc, paths) == []


def test_every_websocket_route_is_in_the_contract(app: FastAPI, doc: str) -> None:
    routes = websocket_paths(app)
    assert "/v1/sessions/{id}/actions/ws" in routes, routes
    assert missing_from(doc, routes, websocket=True) == []


def test_the_contract_names_no_path_the_server_does_not_serve(app: FastAPI, doc: str) -> None:
    assert sorted(documented_paths(doc) - served_paths(app)) == []


def test_a_missing_path_is_reported() -> None:
    text = ("`GET /v1/sessions/{id}` and `WS /v1/sessions/{id}/vnc`; "
            "see `/v1/sessions/{id}/exec?x=1`.")
    assert missing_from(text, ["/v1/sessions/{id}", "/v1/sessions/{id}/exec"]) == []
    # A prefix of a documented path is not the path itself.
    assert missing_from(text, ["/v1/sessions", "/v1/sessions/{id}/files"]) == [
        "/v1/sessions", "/v1/sessions/{id}/files"]
    assert missing_from(text, ["/v1/sessions/{id}/vnc"], websocket=True) == []
    assert missing_from(text, ["/v1/sessions/{id}/exec"], websocket=True) == [
        "/v1/sessions/{id}/exec"]
    assert normalise("/v1/snapshots/{snapshot_id}/pool") == "/v1/snapshots/{id}/pool"
