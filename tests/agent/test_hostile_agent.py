"""Hostile agents (tests/agent/hostile_agent.py, raw bytes on a unix socket) against the
real host client: each fails its own connection fast, with a clear reason, without memory
growth here, while a connection to a good agent keeps working."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deskbox_server.agent import AgentClient, AgentLimits, ExecStatus
from deskbox_server.errors import AgentFailed, SessionFailed, Timeout

MIB = 1024 * 1024
FAKE = Path(__file__).with_name("hostile_agent.py")
LIMITS = AgentLimits(handshake_timeout_s=1.0, call_timeout_s=2.0, exec_grace_s=0.5)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@contextmanager
def hostile(mode: str, tmp_path: Path) -> Iterator[str]:
    path = tmp_path / f"{mode}.sock"
    proc = subprocess.Popen([sys.executable, str(FAKE), mode, str(path)],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        yield str(path)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


async def good_agent_works(agent_socket: Path) -> None:
    """A second connection, to a good agent, answers as if nothing happened."""
    good = await AgentClient.connect_unix(str(agent_socket))
    try:
        assert (await good.call("echo", {"x": 1})).json() == {"x": 1}
        items = [item async for item in good.exec(["echo", "fine"])]
        assert isinstance(items[-1], ExecStatus) and items[-1].exit_code == 0
    finally:
        await good.close()


HANDSHAKE_ATTACKS = [
    ("garbage", "not HTTP/2: the first frame is not SETTINGS"),
    ("silent", "no HTTP/2 SETTINGS within 1.0 s"),
    ("huge_frame", f"announces 16777215 bytes, over the {LIMITS.max_frame_size} allowed"),
    ("settings_flood", "a flood of frames without payload"),
    ("ping_flood", "a flood of frames without payload"),
    ("no_answer", "no answer to hello"),
    ("wrong_version", "the agent speaks protocol 2 .* this server speaks protocol 1"),
    ("hello_refused", "hello failed: agent: status 404: \\(no body\\)"),
]


@pytest.mark.parametrize(("mode", "reason"), HANDSHAKE_ATTACKS, ids=[m for m, _ in
                                                                     HANDSHAKE_ATTACKS])
async def test_hostile_handshake(
    mode: str, reason: str, tmp_path: Path, agent_socket: Path
) -> None:
    with hostile(mode, tmp_path) as path:
        rss = _rss()
        started = time.monotonic()
        with pytest.raises(AgentFailed, match=reason) as failure:
            await AgentClient.connect_unix(path, LIMITS)
        elapsed = time.monotonic() - started
        growth = _rss() - rss
    assert isinstance(failure.value, SessionFailed)  # the API's 502 session_failed
    # Only silence waits for the handshake timeout; everything else fails at once.
    limit = LIMITS.handshake_timeout_s + 1.0 if mode in ("silent", "no_answer") else 0.9
    assert elapsed < limit, elapsed
    assert growth < 4 * MIB, growth
    await good_agent_works(agent_socket)


CALL_ATTACKS = [
    ("continuation_flood", "a header block over 32768 bytes"),
    ("header_bomb", "HTTP/2 protocol error: .*header"),
    ("unknown_stream", "HTTP/2 protocol error"),
    ("data_before_headers", "HTTP/2 protocol error|DATA before"),
    ("data_flood", "HTTP/2 protocol error: Flow control window|more unread data than its window"),
    ("bad_records", "exec: a bad record"),
    ("output_flood", "exec: more output than the 1048576 asked for"),
    ("calls_wrong_type", "calls: answered 200 'application/octet-stream'"),
    ("calls_huge_head", "calls: a reply head of 1073741824 bytes"),
    ("calls_bad_head", r"calls: a reply head is not \{status, content_type, size\}"),
    ("calls_huge_reply", "calls: echo: a reply of 314572800 bytes"),
]


@pytest.mark.parametrize(("mode", "reason"), CALL_ATTACKS, ids=[m for m, _ in CALL_ATTACKS])
async def test_hostile_answers(
    mode: str, reason: str, tmp_path: Path, agent_socket: Path
) -> None:
    """The handshake goes well; the answer to the next call is the attack."""
    with hostile(mode, tmp_path) as path:
        client = await AgentClient.connect_unix(path, LIMITS)
        rss = _rss()
        started = time.monotonic()
        with pytest.raises(AgentFailed, match=reason):
            if mode == "data_flood":
                # A channel the host does not read: only the window may arrive.
                channel = await client.open_tcp(9222)
                for _ in range(100):
                    if client.failed_reason:
                        break
                    await asyncio.sleep(0.02)
                await channel.read()
            elif mode in ("bad_records", "output_flood"):
                async for _ in client.exec(["true"]):
                    pass
            else:
                await client.call("echo", {})
        elapsed = time.monotonic() - started
        growth = _rss() - rss
        # Every later call on that connection fails at once with the same reason.
        with pytest.raises(AgentFailed, match=reason):
            await client.health()
        await client.close()
    assert elapsed < 2.0, elapsed
    assert growth < 8 * MIB, growth
    await good_agent_works(agent_socket)


async def test_a_call_nobody_answers_times_out_alone(tmp_path: Path, agent_socket: Path) -> None:
    """An agent that accepts a call and never answers: that call times out, nothing else."""
    with hostile("never_answers_call", tmp_path) as path:
        client = await AgentClient.connect_unix(path, LIMITS)
        started = time.monotonic()
        with pytest.raises(Exception, match="did not answer") as failure:
            await client.call("echo", {}, timeout_s=0.5)
        assert type(failure.value).__name__ == "Timeout"
        assert 0.5 <= time.monotonic() - started < 1.5
        await client.close()
    await good_agent_works(agent_socket)


@pytest.mark.parametrize(("mode", "close_timeout_s", "waited_s"), [
    ("slow_hang_up", 2.0, 0.3),  # closes its end 0.3 s after our GOAWAY: waited for
    ("never_answers_call", 0.5, 0.5),  # never closes it: cut off after close_timeout_s
])
async def test_closing_for_a_checkpoint_waits_for_the_agent_to_hang_up(
    mode: str, close_timeout_s: float, waited_s: float, tmp_path: Path, agent_socket: Path
) -> None:
    """CRIU refuses a sandbox whose socket names a peer outside it, even a peer already
    closed: before a checkpoint, the host's close returns once the agent has closed its
    end too, or after ``close_timeout_s``; either way as a close, not as a failure."""
    limits = dataclasses.replace(LIMITS, close_timeout_s=close_timeout_s)
    with hostile(mode, tmp_path) as path:
        client = await AgentClient.connect_unix(path, limits)
        started = time.monotonic()
        await client.close(wait_for_agent=True)
        assert waited_s <= time.monotonic() - started < waited_s + 1.0
        assert client.failed_reason == "the connection was closed by the host"
    await good_agent_works(agent_socket)


async def test_the_agent_survives_bad_clients(agent_socket: Path) -> None:
    """Anything in the sandbox can reach the agent's socket too: garbage, a frame header
    announcing 16 MiB, or a client that connects and says nothing ends only that
    connection; the host's connection goes on answering."""
    good = await AgentClient.connect_unix(str(agent_socket))
    try:
        bad = []
        for attack in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\x00" * 4096,
                       b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff\xff\xff\x00\x00\x00\x00\x00\x01"
                       + b"x" * 65536,
                       b""):
            reader, writer = await asyncio.open_unix_connection(str(agent_socket))
            writer.write(attack)
            bad.append((reader, writer))
        for reader, _ in bad[:2]:  # the agent hangs up on the two that spoke nonsense
            async with asyncio.timeout(5):
                while await reader.read(65536):
                    pass
        assert (await good.call("echo", {"after": "attacks"})).json() == {"after": "attacks"}
        for _, bad_writer in bad:
            bad_writer.close()
    finally:
        await good.close()


async def test_an_exec_that_never_ends_times_out_alone(tmp_path: Path) -> None:
    """A status record without END_STREAM after it: the exec times out at its deadline."""
    with hostile("status_no_end", tmp_path) as path:
        client = await AgentClient.connect_unix(path, LIMITS)
        started = time.monotonic()
        with pytest.raises(Timeout, match="the agent did not finish in time"):
            async for _ in client.exec(["true"], timeout_s=0.5):
                pass
        assert 1.0 <= time.monotonic() - started < 2.0
        assert client.failed_reason is None
        await client.close()
