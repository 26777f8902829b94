"""The exec and file machinery of the container backend, against a real sandbox: commands
and files go through the sandbox's agent (sandbox_agent.py), x11vnc through runc exec.

The HTTP side is tested in tests/api/test_exec.py; here, what the host does: it signals
only processes of the sandbox, it stops reading output it does not need, and nothing it
starts outlives a command.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from deskbox_server.agent.exec_slots import ExecSlots
from deskbox_server.agent.sandbox_io import AgentSandboxIO
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.errors import NotFound
from deskbox_server.sandbox_io import ExecCommand, ExecResult, FileTooLarge

from ..sandbox_agent import connect_agent
from .conftest import exec_in

T = TypeVar("T")


def with_agent(
    sandbox: RuncSandbox, scenario: Callable[[AgentSandboxIO], Awaitable[T]]
) -> T:
    """``scenario`` with a new stream to the sandbox's agent, closed after."""

    async def run() -> T:
        client = await connect_agent(sandbox)
        try:
            env, cwd = sandbox.exec_environment()
            io = AgentSandboxIO(client, env, cwd, ExecSlots(8, sandbox.label))
            return await scenario(io)
        finally:
            await client.close()

    return asyncio.run(run())


def execute(sandbox: RuncSandbox, command: ExecCommand) -> ExecResult:
    return with_agent(sandbox, lambda io: io.run(command))


def names_inside(sandbox: RuncSandbox) -> list[str]:
    script = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done"
    return exec_in(sandbox, "sh", "-c", script).stdout.split()


def test_timeout_kills_nested_children(sandbox: RuncSandbox) -> None:
    command = ExecCommand(
        ["sh", "-c", "sh -c 'sleep 300 & sleep 301' & sleep 302 & echo up; sleep 303"],
        timeout_s=1.0,
    )
    result = execute(sandbox, command)
    assert result.timed_out and result.exit_code is None and result.stdout == b"up\n"
    assert "sleep" not in names_inside(sandbox)
    assert not list(sandbox.bundle.glob("exec-*")), "no runc exec for a command"


def test_a_daemon_holding_stdout_does_not_hold_the_command(sandbox: RuncSandbox) -> None:
    started = time.monotonic()
    command = ExecCommand(["sh", "-c", "setsid sleep 60 & echo done; exit 5"], timeout_s=30)
    result = execute(sandbox, command)
    assert time.monotonic() - started < 5
    assert result.exit_code == 5 and result.stdout == b"done\n"
    assert exec_in(sandbox, "pkill", "-x", "sleep").returncode == 0


def test_files_round_trip_and_caps(sandbox: RuncSandbox) -> None:
    data = os.urandom(300_000)

    async def chunks(payload: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 65536):
            yield payload[start:start + 65536]

    async def scenario(run: AgentSandboxIO) -> None:
        assert await run.write_file("/root/blob", chunks(data), len(data)) == len(data)
        download = await run.read_file("/root/blob", len(data))
        try:
            assert download.size == len(data)
            assert b"".join([piece async for piece in download.chunks()]) == data
        finally:
            await download.aclose()
        with pytest.raises(FileTooLarge):
            await run.read_file("/root/blob", len(data) - 1)
        with pytest.raises(FileTooLarge):
            await run.write_file("/root/blob", chunks(data + b"!"), len(data))
        with pytest.raises(NotFound):
            await run.read_file("/root/no-such-file", 10)
        assert run.slots.in_use == 0  # every transfer gave its slot back
        # /proc files say size 0: read up to the cap, never past it.
        download = await run.read_file("/proc/self/status", 1 << 20)
        try:
            status = b"".join([piece async for piece in download.chunks()])
        finally:
            await download.aclose()
        assert b"NoNewPrivs:\t1" in status

    with_agent(sandbox, scenario)
    digest = exec_in(sandbox, "sha256sum", "/root/blob").stdout.split()[0]
    assert digest == hashlib.sha256(data).hexdigest()  # the failed upload left it intact
    assert "deskbox-upload" not in exec_in(sandbox, "ls", "-A", "/root").stdout
