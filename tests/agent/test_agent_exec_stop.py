"""Stopping an exec with ``stop_grace_s`` (PROTOCOL.md): SIGTERM, the grace, then SIGKILL.

The session's VNC server runs as such an exec (agent/vnc.py): x11vnc frees its
shared memory only on a signal it handles.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from deskbox_server.agent import AgentClient, ExecChunk
from deskbox_server.errors import InvalidRequest

from .test_agent_rpc import run


def gone(pid: int) -> bool:
    """The process ended (a zombie counts); ESRCH while reading means it just did."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


async def _started(client: AgentClient, script: str, grace: float) -> None:
    """Run ``script`` until its first output, then close the call (the host resets it)."""
    gen = client.exec(["sh", "-c", script], timeout_s=120, stop_grace_s=grace)
    async for item in gen:
        assert isinstance(item, ExecChunk)
        break
    await gen.aclose()


async def _wait_gone(pid: int, timeout_s: float) -> float:
    started = time.monotonic()
    while not gone(pid):
        assert time.monotonic() - started < timeout_s, f"process {pid} is still there"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_reset_stops_with_sigterm_first(client: AgentClient, tmp_path: Path) -> None:
    marker, pidfile = tmp_path / "term", tmp_path / "pid"
    script = (f"trap 'echo handled > {marker}; exit 0' TERM; echo $$ > {pidfile}; echo go; "
              "sleep 60 & wait")
    await _started(client, script, grace=5)
    await _wait_gone(int(pidfile.read_text()), 5)
    assert marker.read_text() == "handled\n"  # it ran its own handler: not killed outright


async def test_without_a_grace_a_reset_kills(client: AgentClient, tmp_path: Path) -> None:
    marker, pidfile = tmp_path / "term", tmp_path / "pid"
    script = (f"trap 'echo handled > {marker}; exit 0' TERM; echo $$ > {pidfile}; echo go; "
              "sleep 60 & wait")
    await _started(client, script, grace=0)
    await _wait_gone(int(pidfile.read_text()), 5)
    assert not marker.exists()


async def test_what_ignores_sigterm_is_killed_after_the_grace(
    client: AgentClient, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; echo $$ > {pidfile}; echo go; while :; do sleep 0.05; done"
    await _started(client, script, grace=0.6)
    took = await _wait_gone(int(pidfile.read_text()), 5)
    assert took > 0.4, took  # it outlived the SIGTERM ...
    assert await client.health() >= 0  # ... and the connection went on meanwhile


async def test_a_timeout_with_a_grace_reports_timed_out(
    client: AgentClient, tmp_path: Path
) -> None:
    marker = tmp_path / "term"
    script = f"trap 'echo handled > {marker}; exit 3' TERM; echo go; sleep 60 & wait"
    started = time.monotonic()
    _, status = await run(client, ["sh", "-c", script], timeout_s=0.5, stop_grace_s=5)
    assert status.timed_out and status.exit_code is None
    assert time.monotonic() - started < 4
    assert marker.read_text() == "handled\n"


@pytest.mark.parametrize("grace", [-1, 61, True])
async def test_bad_graces_are_refused(client: AgentClient, grace: object) -> None:
    with pytest.raises(InvalidRequest, match="stop_grace_s"):
        await run(client, ["true"], stop_grace_s=grace)
