"""Sessions whose agent a process of the sandbox replaced: what the tests of impostor agents
share (tests/state/test_agent_stream.py, tests/security/test_hostile_agent.py).

A program exec'd in the session (its own python3) unlinks the agent's socket and listens at
its path. The host's stream still leads to the real agent (it connected through its own
link, agent_link.py); after the next restore the host links the path's socket, which is
the impostor's, and connects to it: from then on it is just another hostile agent.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

__all__ = ["failed_event", "hibernate_resume", "new_session", "run", "start_impostor",
           "wait_failed"]

READY = "/tmp/impostor-ready"  # the impostor writes it once it listens


def new_session(client: httpx.Client, **body: Any) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def run(client: httpx.Client, session_id: str, *cmd: str, **extra: Any) -> Any:
    response = client.post(f"/v1/sessions/{session_id}/exec",
                           json={"cmd": list(cmd), "timeout_s": 30, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def start_impostor(client: httpx.Client, session_id: str, program: str, *args: str) -> None:
    """Runs ``program`` (Python source) in the session, in the background, and waits until it
    wrote READY."""
    started = run(client, session_id, "python3", "-c", program, *args, background=True)
    assert started["pid"], started
    deadline = time.monotonic() + 20
    while run(client, session_id, "test", "-e", READY)["exit_code"] != 0:
        assert time.monotonic() < deadline, "the impostor did not start"
        time.sleep(0.1)


def hibernate_resume(client: httpx.Client, session_id: str) -> httpx.Response:
    """Checkpoints the session and restores it: the host connects to the agent's path anew.
    The response of the resume."""
    paused = client.post(f"/v1/sessions/{session_id}/pause", json={"mode": "hibernate"})
    assert paused.status_code == 200, paused.text
    return client.post(f"/v1/sessions/{session_id}/resume")


def wait_failed(client: httpx.Client, session_id: str, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (body := client.get(f"/v1/sessions/{session_id}").json())["state"] != "failed":
        assert time.monotonic() < deadline, body
        time.sleep(0.1)
    result: dict[str, Any] = body
    return result


def failed_event(client: httpx.Client, session_id: str) -> dict[str, Any]:
    """The session's ``state`` event that says it failed (its event stream ended there)."""
    with client.stream("GET", f"/v1/sessions/{session_id}/events", timeout=20) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                event: dict[str, Any] = json.loads(line[len("data: "):])
                if event.get("state") == "failed":
                    return event
    raise AssertionError("no failed state in the session's events")
