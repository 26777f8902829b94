"""A create cancelled midway, by a delete of the starting session, leaves no container:
the daemon makes one all the same once asked, also after the server stopped waiting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .podman import Podman
from .test_docker_sessions import containers, docker_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_deletes_of_starting_sessions_leave_no_container(podman: Podman, tmp_path: Path) -> None:
    """Deletes at moments through the start (the container's create is the first
    ~50 ms): one that came while Podman made the container left it there, "Created", for
    good (the next server's start removed it), its session said stopped."""
    with docker_server(podman, tmp_path / "state", tmp_path / "server.log") as server:
        http = server.client
        ids = []
        for step in range(40):
            made = http.post("/v1/sessions", params={"wait": "false"}, json={})
            assert made.status_code == 201, made.text
            ids.append(made.json()["id"])
            time.sleep(step * 0.004)
            assert http.delete(f"/v1/sessions/{ids[-1]}").status_code == 204
        time.sleep(5)  # what the daemon would still make
        left = [name for name in containers(podman) if name.rsplit("-", 1)[-1] in ids]
        for name in left:
            podman.cli("rm", "--force", name)
        assert not left, [ids.index(name.rsplit("-", 1)[-1]) for name in left]
