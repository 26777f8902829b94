"""``--listen serial:PATH``: the agent over a character device, here a pseudo-terminal
(as a VM's virtio-serial port would be): the tty is put in raw mode, bytes pass as they are."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from deskbox_server.agent import AgentClient, ExecStatus
from deskbox_server.errors import InvalidRequest

from .conftest import agent_env


@pytest.fixture
def tty_agent() -> Iterator[int]:
    """The agent serving the slave side of a new pty; yields the master's fd."""
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deskbox_agent", "--listen", f"serial:{os.ttyname(slave)}"],
        env=agent_env(), stderr=subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(b"deskbox-agent 0.1.0 serving"), line
        os.close(slave)
        yield master
    finally:
        proc.terminate()
        proc.wait(5)
        assert proc.stderr is not None
        proc.stderr.close()


async def test_agent_over_a_tty(tty_agent: int) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 18)
    protocol = asyncio.StreamReaderProtocol(reader)
    read_file = os.fdopen(tty_agent, "rb", buffering=0)
    write_file = os.fdopen(os.dup(tty_agent), "wb", buffering=0)
    read_transport, _ = await loop.connect_read_pipe(lambda: protocol, read_file)
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, write_file)
    writer = asyncio.StreamWriter(write_transport, write_protocol, reader, loop)
    client = await AgentClient.connect(reader, writer)
    try:
        # Every byte value crosses unchanged (no echo, no CR/LF mapping, no ^C).
        payload = bytes(range(256)) * 512
        result = await client.call("echo", {"data": payload.decode("latin-1")})
        assert result.json() == {"data": payload.decode("latin-1")}
        with pytest.raises(InvalidRequest, match="exceeds 1048576 bytes"):
            await client.call("echo", {"data": "x" * (2 << 20)})
        items = [item async for item in client.exec(["printf", "a\\r\\nb\\x03"])]
        assert isinstance(items[-1], ExecStatus) and items[-1].exit_code == 0
        assert b"".join(i.data for i in items[:-1]) == b"a\r\nb\x03"  # type: ignore[union-attr]
    finally:
        await client.close()
        read_transport.close()
