"""A container engine or a Kubernetes API server that accepts connections and never answers
(a storage lock held, a service stopped with SIGSTOP, a half-open connection): each call
fails within its bound with a reason, instead of holding a create, and the delete and the
shutdown that wait for it, for ever (neither client has a timeout of its own). The silent
peers are real sockets on this machine; the bounds are shortened for the test."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from deskbox_server.engines.docker import daemon as docker_daemon
from deskbox_server.engines.kubernetes import cluster as kubernetes_cluster
from deskbox_server.errors import Internal

BOUND_S = 0.5


@asynccontextmanager
async def silent_server(family: socket.AddressFamily, address: str | tuple[str, int]
                        ) -> AsyncIterator[socket.socket]:
    """Accepts every connection, reads what comes and never answers."""
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    listener.setblocking(False)
    held: list[socket.socket] = []
    loop = asyncio.get_running_loop()

    async def accept_forever() -> None:
        while True:
            connection, _ = await loop.sock_accept(listener)
            held.append(connection)

    accepting = asyncio.create_task(accept_forever())
    try:
        yield listener
    finally:
        accepting.cancel()
        for connection in held:
            connection.close()
        listener.close()


async def test_a_container_engine_that_never_answers_fails_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(docker_daemon, "_CALL_TIMEOUT_S", BOUND_S, raising=False)
    path = tmp_path / "docker.sock"
    async with silent_server(socket.AF_UNIX, str(path)):
        daemon = docker_daemon.Daemon(f"unix://{path}")
        started = time.monotonic()
        with pytest.raises(Internal, match=r"no answer to 'tell its version' within 0\.5 s"):
            await daemon.open()
        assert time.monotonic() - started < 5


async def test_a_kubernetes_api_that_never_answers_fails_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubernetes_cluster, "_CALL_TIMEOUT_S", BOUND_S, raising=False)
    async with silent_server(socket.AF_INET, ("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        cluster = kubernetes_cluster.Cluster(f"http://127.0.0.1:{port}", "deskbox")
        started = time.monotonic()
        with pytest.raises(Internal, match=r"did not answer 'list pods' within 0\.5 s"):
            await cluster.open()
        assert time.monotonic() - started < 5
