"""``--token-file``: a pod's agent on TCP serves a connection only after its first line
proved the token (PROTOCOL.md "A pod's agent: the token line"), through the kubernetes
engine's own connect (engines/kubernetes/agent_tcp.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.agent import AgentClient
from deskbox_server.engines.kubernetes.agent_tcp import connect_agent, token_line
from deskbox_server.errors import AgentFailed

from ..api.served import free_port
from .conftest import agent_env

TOKEN = "t" * 20 + "0123456789abcdefghijklmnop"


def run_agent(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "deskbox_agent", *args], env=agent_env(),
                            stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def agent_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    proc = run_agent("--listen", f"tcp:127.0.0.1:{port}", "--token-file", str(token_file))
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert b"listening on tcp:127.0.0.1" in line, line
        yield port
    finally:
        proc.terminate()
        proc.wait(5)
        assert proc.stderr is not None
        proc.stderr.close()


def first_bytes(port: int, send: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(send)
        chunks = []
        while chunk := connection.recv(4096):
            chunks.append(chunk)
        return b"".join(chunks)


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


async def test_the_right_token_gets_the_agent(agent_port: int) -> None:
    reader, writer = await connect_agent("127.0.0.1", agent_port, TOKEN, 1 << 18)
    client = await AgentClient.connect(reader, writer)
    try:
        assert (await client.call("echo", {"a": "ö"})).json() == {"a": "ö"}
    finally:
        await client.close()


@pytest.mark.parametrize("send", [
    PREFACE,  # HTTP/2 at once, no token line
    token_line("x" * len(TOKEN)) + PREFACE,  # a wrong token
    token_line(TOKEN[:-1]) + PREFACE,  # a prefix of it
    b"DESKBOX-AGENT-TOKEN " + TOKEN.encode() + b" \n" + PREFACE,  # not exactly the line
])
def test_anything_else_gets_a_closed_connection_and_nothing_more(
    agent_port: int, send: bytes
) -> None:
    assert first_bytes(agent_port, send) == b""


async def test_a_closed_port_is_a_clear_agent_failure() -> None:
    with pytest.raises(AgentFailed, match="does not answer"):
        await connect_agent("127.0.0.1", free_port(), TOKEN, 1024)


@pytest.mark.parametrize(("content", "listen", "message"), [
    ("short", "tcp", b"must be 32 or more printable ASCII characters"),
    (TOKEN, "unix", b"--token-file is for tcp: addresses"),
    (None, "tcp", b"cannot read the token file"),
])
def test_a_bad_token_setup_stops_the_agent_with_its_reason(
    tmp_path: Path, content: str | None, listen: str, message: bytes
) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    address = f"tcp:127.0.0.1:{free_port()}" if listen == "tcp" else f"unix:{tmp_path}/s"
    proc = run_agent("--listen", address, "--token-file", str(token_file))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and message in err, err


