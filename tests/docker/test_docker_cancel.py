"""A create cancelled midway, by a delete of the starting session, leaves no container:
the daemon makes one all the same once asked, also after the server stopped waiting.

The server reaches Podman through a proxy of the test's on the Engine API's socket (the
docker host is a setting: a seam of ours), which holds a container's create on its way
to Podman for a moment and then passes it on, as a busy daemon still working on a request
its client gave up. Podman itself, the server and its clean-up are the real ones.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .podman import Podman
from .test_docker_sessions import containers, docker_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOLD_S = 1.5


class HoldingProxy:
    """Relays the Engine API's socket; once :attr:`armed`, the next container create is
    held ``HOLD_S`` before it goes on to Podman (whether its client still waits or not),
    and :attr:`holding` is set meanwhile."""

    def __init__(self, upstream: str, path: Path) -> None:
        self.upstream, self.path = upstream, path
        self.armed, self.holding = threading.Event(), threading.Event()
        self.held_at = 0.0  # time.monotonic() when it began to hold the create
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # closed: the test is over
            while True:
                client, _ = self._listener.accept()
                server = socket.socket(socket.AF_UNIX)
                server.connect(self.upstream)
                threading.Thread(target=self._requests, args=(client, server),
                                 daemon=True).start()
                threading.Thread(target=self._answers, args=(server, client),
                                 daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if b"/containers/create" in data and self.armed.is_set():
                    self.armed.clear()
                    self.held_at = time.monotonic()
                    self.holding.set()
                    time.sleep(HOLD_S)
                    self.holding.clear()
                server.sendall(data)
        # The client gone, Podman's end stays open until it answered: an HTTP server reads
        # a closed request side as the request abandoned, which Podman's API does not see
        # when its client was the one that let go (the request already in its hands).

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                with contextlib.suppress(OSError):  # the client left: the answer is read
                    client.sendall(data)
        for end in (server, client):
            end.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def proxy(podman: Podman, tmp_path: Path) -> Iterator[HoldingProxy]:
    relay = HoldingProxy(podman.url.removeprefix("unix://"), tmp_path / "engine-api.sock")
    try:
        yield relay
    finally:
        relay.close()


def test_a_delete_while_the_daemon_makes_the_container_leaves_none(
    podman: Podman, proxy: HoldingProxy, tmp_path: Path,
) -> None:
    """A delete that came while Podman was still to make the container (its create under
    way) cancelled the request, found no container of the session's name to remove, and
    answered; Podman made it after, "Created", for good (until the next server's start),
    its session said stopped."""
    with docker_server(podman, tmp_path / "state", tmp_path / "server.log",
                       {"DESKBOX_DOCKER_HOST": f"unix://{proxy.path}"}) as server:
        http = server.client
        proxy.armed.set()
        made = http.post("/v1/sessions", params={"wait": "false"}, json={})
        assert made.status_code == 201, made.text
        sid = made.json()["id"]
        assert proxy.holding.wait(30), "the server never asked for the container"
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204
        # What Podman would still make once the create went on to it.
        deadline = proxy.held_at + HOLD_S + 3
        left = [name for name in containers(podman) if name.endswith(sid)]
        while not left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [name for name in containers(podman) if name.endswith(sid)]
        for name in left:
            podman.cli("rm", "--force", name)
        assert not left, f"the session's container outlived its delete: {left}"
        assert http.get(f"/v1/sessions/{sid}").json()["state"] == "stopped"
