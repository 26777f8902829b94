"""``/metrics`` counts what happened; ``/openapi.json`` documents the paths of API.md."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import httpx

from deskbox_server.logs import JsonFormatter

from .conftest import Server


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(f"{name}{{{wanted}}}" if labels else name) + r" ([0-9.e+-]+)$"
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"{name} {labels} not in metrics"
    return float(match[1])


def test_metrics(server: Server, client: httpx.Client, session: dict[str, Any]) -> None:
    client.post(f"/v1/sessions/{session['id']}/actions", json={"type": "screen_size"})
    client.get(f"/v1/sessions/{session['id']}/screenshot", params={"format": "webp"})
    client.post(f"/v1/sessions/{session['id']}/actions", json={"type": "nope"})
    with server.client(None) as anonymous:
        response = anonymous.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    assert metric(text, "deskbox_sessions", state="running") >= 1
    assert metric(text, "deskbox_actions_total", type="screen_size", outcome="ok") >= 1
    assert metric(text, "deskbox_screenshots_total", format="webp") >= 1
    assert metric(text, "deskbox_errors_total", type="invalid_request") >= 1
    assert metric(text, "deskbox_action_duration_seconds_count", type="screen_size") >= 1
    assert "# TYPE deskbox_action_duration_seconds histogram" in text


def test_openapi_lists_the_implemented_paths(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"post", "get"} <= set(paths["/v1/sessions"])
    assert {"get", "delete"} <= set(paths["/v1/sessions/{session_id}"])
    for path in ("/v1/sessions/{session_id}/keepalive", "/v1/sessions/{session_id}/actions"):
        assert "post" in paths[path]
    assert "get" in paths["/v1/sessions/{session_id}/screenshot"]
    for dialect in ("anthropic", "openai"):
        assert "post" in paths[f"/v1/sessions/{{session_id}}/actions/{dialect}"]
    assert "get" in paths["/healthz"] and "get" in paths["/metrics"]


def test_access_log_is_json_and_never_holds_the_query_string(
    server: Server, client: httpx.Client
) -> None:
    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    handler = Capture()
    access = logging.getLogger("deskbox.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        response = client.get("/v1/sessions", params={"token": "s3cr3t-token-value"})
        assert response.status_code == 200
        # The line is written once the answer has gone out: it may come just after it.
        deadline = time.monotonic() + 5
        while not any(response.headers["x-request-id"] in line for line in lines):
            assert time.monotonic() < deadline, "no access log line for the request"
            time.sleep(0.01)
    finally:
        access.removeHandler(handler)
    entries = [json.loads(line) for line in lines]
    mine = [e for e in entries if e["request_id"] == response.headers["x-request-id"]]
    assert len(mine) == 1
    assert mine[0]["message"] == "GET /v1/sessions 200"
    assert mine[0]["status"] == 200 and mine[0]["duration_ms"] >= 0
    assert not any("s3cr3t" in line for line in lines)
