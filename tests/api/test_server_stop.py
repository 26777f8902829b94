"""A clean stop (SIGTERM) of ``deskbox serve`` while clients follow sessions' events."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

from .served import serve

LOCAL = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local",
         "DESKBOX_SHUTDOWN_GRACE_S": "10"}


def test_event_streams_say_the_server_stops_and_end_without_holding_the_stop(
    tmp_path: Path,
) -> None:
    """Each open stream gets ``server_stopping`` and ends at once. It was held open until
    the requests' grace ran out, then cut off (no event; "Exception in ASGI application" in
    the server's log), so every stop with a follower took the whole grace."""
    log = tmp_path / "server.log"
    with serve(tmp_path / "state", log, LOCAL) as (server, http):
        created = http.post("/v1/sessions", json={"display": {"width": 640, "height": 400}})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        received: list[dict[str, Any]] = []
        ended = threading.Event()
        following = threading.Event()

        def follow() -> None:
            with http.stream("GET", f"/v1/sessions/{sid}/events", timeout=30) as stream:
                following.set()
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        received.append(json.loads(line[6:]))
            ended.set()

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        assert following.wait(10)
        deadline = time.monotonic() + 10
        while not received:  # the session's own `running` event came through
            assert time.monotonic() < deadline, "no event on the stream"
            time.sleep(0.05)
        stopping = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        took_s = time.monotonic() - stopping
        assert ended.wait(5), "the stream did not end"
    assert [e["type"] for e in received][-1] == "server_stopping", received
    assert received[-1]["reason"] == "the server is stopping"
    assert took_s < 5, f"the stop took {took_s:.1f} s (the grace is 10 s)"
    said = log.read_text()
    assert "Exception in ASGI application" not in said, said[-3000:]
    assert "deskbox stopped every session" in said
