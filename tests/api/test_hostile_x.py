"""Issue 13's impostor X server through the real server: it fails its own session only.

The race of issue 13 ends with the host's path to a session's X socket leading to a socket
the sandbox controls. Here the test puts an impostor there (the race itself is the lead's
fix), relaying to the real X server; the next host connection to that display (the
clipboard's, made on first use) gets a reply announcing 300 MiB, followed by the filler.
The session fails with that reason; the server's memory, a neighbouring session's
screenshots and /healthz stay as they were.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.impostor_x import MIB, Impostor

from .conftest import Server
from .containers import container_server, open_session, sandbox_handle
from .helpers import assert_error

pytestmark = pytest.mark.slow

ATTACK = 300 * MIB


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with container_server(tmp_path_factory, "hostile-x") as running:
        yield running


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _median_ms(call: Callable[[], object], times: int = 10) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def test_impostor_fails_its_session_only(server: Server) -> None:
    with (
        server.client() as client,
        open_session(client) as victim,
        open_session(client) as neighbour,
    ):
        def shot() -> None:
            response = client.get(f"/v1/sessions/{neighbour['id']}/screenshot")
            assert response.status_code == 200

        def health() -> None:
            assert client.get("/healthz").status_code == 200

        shot_before, health_before = _median_ms(shot), _median_ms(health)
        display = sandbox_handle(server, victim).sandbox.display
        assert display is not None
        # Both on the session's small tmpfs, where the host keeps its link to the socket.
        real = display.private_dir / "real-x"
        os.link(display.private_socket, real)
        fake = Impostor(str(real), display.private_dir / "impostor")
        try:
            os.replace(fake.path, display.private_socket)  # what the race won
            fake.inflate_next_reply(ATTACK)
            rss = _rss()
            started = time.monotonic()
            response = client.post(
                f"/v1/sessions/{victim['id']}/actions", json={"type": "clipboard_get"}
            )
            elapsed = time.monotonic() - started
            error = assert_error(response, 502, "session_failed")
            assert "the X server sent a 300 MiB reply (limit 4.9 MiB)" in error["message"]
            assert elapsed < 2.0
            assert fake.links, "the host never connected to the impostor"
            deadline = time.monotonic() + 10
            while (body := client.get(f"/v1/sessions/{victim['id']}").json())["state"] != "failed":
                assert time.monotonic() < deadline, body
                time.sleep(0.05)
            assert "300 MiB reply" in body["failure"]["reason"]
            assert _rss() - rss < 16 * MIB
        finally:
            fake.close()
            real.unlink(missing_ok=True)  # gone with the failed session
        # The neighbour and the server carry on as before (within the noise of a busy host).
        assert client.get(f"/v1/sessions/{neighbour['id']}").json()["state"] == "running"
        assert _median_ms(shot) < max(3 * shot_before, shot_before + 50)
        assert _median_ms(health) < max(3 * health_before, health_before + 20)

