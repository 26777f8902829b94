"""The way to a container's agent refuses what a hostile container can put at its path: a
symlink to a host socket is not followed, a file is not a socket; the real socket is
reached (real unix sockets in a temporary directory)."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.docker.agent_socket import agent_socket_ready, connect_agent
from deskbox_server.errors import DesktopFailed

NAME = "deskbox-agent"


@pytest.fixture
def dirs() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory() as shared, tempfile.TemporaryDirectory() as host:
        yield Path(shared), Path(host)


def listening(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    return server


async def greeting(directory: Path) -> bytes:
    reader, writer = await connect_agent(directory, NAME, 1024)
    try:
        return await reader.readexactly(5)
    finally:
        writer.close()


async def answered(server: socket.socket, shared: Path, listen_after_s: float = 0.0) -> bytes:
    """What a connect to the agent's socket reads when ``server`` (listening after
    ``listen_after_s`` if it is only bound) answers it with a greeting."""
    task = asyncio.create_task(greeting(shared))
    if listen_after_s:
        await asyncio.sleep(listen_after_s)
        server.listen(1)
    peer, _ = await asyncio.to_thread(server.accept)
    with peer:
        peer.sendall(b"hello")
        return await task


def test_the_agents_socket_is_reached(dirs: tuple[Path, Path]) -> None:
    shared, _ = dirs
    assert not agent_socket_ready(shared, NAME)
    with listening(shared / NAME) as server:
        assert agent_socket_ready(shared, NAME)
        assert asyncio.run(answered(server, shared)) == b"hello"


def test_a_symlink_to_a_host_socket_is_not_followed(dirs: tuple[Path, Path]) -> None:
    shared, host = dirs
    with listening(host / "daemon.sock"):
        (shared / NAME).symlink_to(host / "daemon.sock")
        with pytest.raises(DesktopFailed, match="other than a socket"):
            agent_socket_ready(shared, NAME)
        with pytest.raises(DesktopFailed, match="other than a socket"):
            asyncio.run(greeting(shared))


def test_a_file_is_not_a_socket(dirs: tuple[Path, Path]) -> None:
    shared, _ = dirs
    (shared / NAME).write_text("not a socket")
    with pytest.raises(DesktopFailed, match="other than a socket"):
        agent_socket_ready(shared, NAME)


def test_a_socket_bound_but_not_yet_listening_is_waited_for(dirs: tuple[Path, Path]) -> None:
    # The agent binds, then listens: a connect in between is refused by the kernel.
    shared, _ = dirs
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(shared / NAME))
        assert asyncio.run(answered(server, shared, listen_after_s=0.3)) == b"hello"


def test_a_socket_nobody_listens_on_fails_in_bounded_time(dirs: tuple[Path, Path]) -> None:
    shared, _ = dirs
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(shared / NAME))
        started = time.monotonic()
        with pytest.raises(DesktopFailed, match="does not answer"):
            asyncio.run(greeting(shared))
        assert time.monotonic() - started < 5
