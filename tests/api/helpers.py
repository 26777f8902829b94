"""Assertions shared by the API tests."""

from __future__ import annotations

import io
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from PIL import Image

__all__ = ["access_statuses", "assert_error", "decode", "events_until", "issue_token", "near",
           "raw_exchange", "server_log", "token_for"]


def assert_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """The response is ``status`` with the error body of API.md, of type ``kind``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    # action_index: which action of a batch failed, when one did (API.md "Errors").
    assert set(error) - {"action_index"} == {"type", "message", "request_id"}, error
    assert type(error.get("action_index", 0)) is int and error.get("action_index", 0) >= 0
    assert error["type"] == kind, error
    assert error["message"] and isinstance(error["message"], str)
    assert error["request_id"].startswith("req_")
    assert response.headers["x-request-id"] == error["request_id"]
    return error


def decode(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def near(pixel: Any, expected: tuple[int, int, int], tolerance: int = 24) -> bool:
    return all(abs(int(p) - e) <= tolerance for p, e in zip(pixel, expected, strict=True))


def events_until(client: httpx.Client, session_id: str,
                 last: str | Callable[[dict[str, Any]], bool], timeout_s: float = 15.0,
                 since: int | None = None) -> list[dict[str, Any]]:
    """The session's events, from the first (or the one after ``since``) to the first of
    type ``last`` (or that ``last`` picks). A keepalive comes every 10 s: the wait is
    checked at least that often."""
    done = (lambda event: event["type"] == last) if isinstance(last, str) else last
    headers = {} if since is None else {"Last-Event-ID": str(since)}
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", f"/v1/sessions/{session_id}/events", timeout=20,
                       headers=headers) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
                if done(events[-1]):
                    return events
            assert time.monotonic() < deadline, f"no {last} event: {events}"
    raise AssertionError(f"the stream ended before {last}: {events}")


def raw_exchange(url: str, data: bytes) -> tuple[list[str], bytes]:
    """Send ``data`` as it is to the server at ``url`` and read until the server closes the
    connection: the answer's status line and header lines, and its body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(data)
        answer = bytearray()
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = bytes(answer).partition(b"\r\n\r\n")
    return head.decode("latin-1").split("\r\n"), body


def issue_token(client: httpx.Client, session_id: str, scope: str,
                ttl_s: int | None = None) -> dict[str, Any]:
    """A new token of ``scope`` for the session: the whole 201 answer (token, expiry, links)."""
    body: dict[str, Any] = {"scope": scope}
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    response = client.post(f"/v1/sessions/{session_id}/tokens", json=body)
    assert response.status_code == 201, response.text
    issued: dict[str, Any] = response.json()
    return issued


def token_for(client: httpx.Client, session_id: str, scope: str,
              ttl_s: int | None = None) -> str:
    """A new token of ``scope`` for the session: its value alone."""
    return str(issue_token(client, session_id, scope, ttl_s)["token"])


@contextmanager
def server_log() -> Iterator[list[logging.LogRecord]]:
    """What the test's server (uvicorn in a thread of this process) logs in the block:
    deskbox's records from INFO up (its access lines among them), uvicorn's as configured
    (its "Exception in ASGI application" among them)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    deskbox, uvicorn = logging.getLogger("deskbox"), logging.getLogger("uvicorn")
    level = deskbox.level
    deskbox.setLevel(logging.INFO)
    deskbox.addHandler(keep)
    uvicorn.addHandler(keep)
    try:
        yield records
    finally:
        uvicorn.removeHandler(keep)
        deskbox.removeHandler(keep)
        deskbox.setLevel(level)


def access_statuses(records: list[logging.LogRecord], method: str, path: str) -> list[int]:
    """The statuses in the access lines among ``records`` of requests to ``path``, each
    written as its request ended on the server."""
    return [int(r.__dict__["status"]) for r in list(records)
            if r.name == "deskbox.access" and r.getMessage().startswith(f"{method} {path} ")]
