"""The real agent and the real host client over a unix socket: the RPCs of protocol 1."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import uvloop

from deskbox_server.agent import PROTOCOL, AgentClient, ExecChunk, ExecStatus
from deskbox_server.errors import AgentFailed, InvalidRequest, NotFound, SessionFailed, Timeout

from .conftest import agent_env


async def run(client: AgentClient, cmd: list[str], **kw: object) -> tuple[
    list[ExecChunk], ExecStatus
]:
    chunks: list[ExecChunk] = []
    async for item in client.exec(cmd, **kw):  # type: ignore[arg-type]
        if isinstance(item, ExecStatus):
            return chunks, item
        chunks.append(item)
    raise AssertionError("no status")


def gone(pid: int) -> bool:
    """The process ended (a zombie counts); ESRCH while reading means it just did."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_version_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "deskbox_agent", "--version"], env=agent_env(),
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"deskbox-agent 0.1.0 protocol {PROTOCOL}"


def test_patience_out_of_range_is_refused() -> None:
    out = subprocess.run([sys.executable, "-m", "deskbox_agent", "--listen", "unix:/nonexistent",
                          "--patience", "0.5"], env=agent_env(), capture_output=True, text=True,
                         check=False)
    assert out.returncode == 2 and "--patience is a factor from 1 to 100" in out.stderr


async def test_hello_and_health(client: AgentClient) -> None:
    hello = await client.hello()
    assert hello.protocol == PROTOCOL and hello.agent == "0.1.0"
    assert {"echo", "blob"} <= set(hello.calls)
    assert client.hello_info == hello
    assert await client.health() >= 0


async def test_exec_exit_codes_and_signals(client: AgentClient) -> None:
    chunks, status = await run(client, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert status.exit_code == 7 and not status.timed_out and status.signal is None
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"
    _, status = await run(client, ["true"])
    assert status.exit_code == 0
    _, status = await run(client, ["sh", "-c", "kill -TERM $$"])
    assert status.exit_code is None and status.signal == 15
    _, status = await run(client, ["sh", "-c", "echo $FOO; pwd"], env={"FOO": "bar"}, cwd="/tmp")
    chunks, _ = await run(client, ["sh", "-c", "echo $FOO; pwd"], env={"FOO": "bar"}, cwd="/tmp")
    assert b"".join(c.data for c in chunks) == b"bar\n/tmp\n"


async def test_exec_refusals(client: AgentClient) -> None:
    with pytest.raises(InvalidRequest, match="cannot run"):
        await run(client, ["/no/such/program"])
    with pytest.raises(InvalidRequest, match="cmd"):
        await run(client, ["a\x00b"])
    # The connection is still good after both.
    assert (await run(client, ["true"]))[1].exit_code == 0


async def test_exec_output_streams_as_it_comes(client: AgentClient) -> None:
    """Each line arrives while the command still runs, in the order it was written."""
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.3; done"
    seen: list[tuple[float, bytes]] = []
    started = time.monotonic()
    async for item in client.exec(["sh", "-c", script]):
        if isinstance(item, ExecChunk):
            seen.append((time.monotonic() - started, item.data))
    text = b"".join(d for _, d in seen)
    assert [line for line in text.split(b"\n") if line.startswith(b"out")] == [
        b"out1", b"out2", b"out3"]
    assert seen[0][0] < 0.3, seen  # the first line came long before the command's end
    assert seen[-1][0] > 0.5


async def test_exec_timeout_kills_the_process_group(client: AgentClient, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pidfile}; echo started; wait"
    started = time.monotonic()
    chunks, status = await run(client, ["sh", "-c", script], timeout_s=0.5)
    assert status.timed_out and status.exit_code is None
    assert time.monotonic() - started < 3
    assert b"started" in b"".join(c.data for c in chunks)
    child = int(pidfile.read_text())
    for _ in range(100):  # the child (same process group) is killed too
        if gone(child):
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError(f"child {child} survived the timeout")


async def test_exec_output_cap(client: AgentClient) -> None:
    chunks, status = await run(client, ["head", "-c", "3000000", "/dev/zero"], max_output=100_000)
    out = b"".join(c.data for c in chunks if c.stream == "stdout")
    assert len(out) == 100_000 and status.stdout_truncated and not status.stderr_truncated
    assert status.exit_code == 0  # the command was never blocked by the cap


async def test_exec_cancelled_by_the_host_kills(client: AgentClient, tmp_path: Path) -> None:
    """A host that stops listening (its stream reset) ends the command."""
    pidfile = tmp_path / "pid"
    gen = client.exec(["sh", "-c", f"echo $$ > {pidfile}; echo go; sleep 60"], timeout_s=120)
    async for item in gen:
        assert isinstance(item, ExecChunk)
        break
    await gen.aclose()
    pid = int(pidfile.read_text())
    for _ in range(150):
        if gone(pid):
            break
        await asyncio.sleep(0.02)
    assert gone(pid)
    assert await client.health() >= 0


async def test_calls(client: AgentClient) -> None:
    assert (await client.call("echo", {"a": [1, "x"]})).json() == {"a": [1, "x"]}
    blob = await client.call("blob", {"size": 140 * 1024})
    assert blob.content_type == "image/jpeg" and blob.body == b"\x5a" * 140 * 1024
    with pytest.raises(NotFound, match="no call named"):
        await client.call("nothing")
    with pytest.raises(SessionFailed, match="a handler bug"):
        await client.call("boom")
    assert (await client.call("echo", {})).json() == {}


async def test_call_timeout_keeps_the_connection(client: AgentClient) -> None:
    # A call that does not finish in time: its stream is cancelled, the connection goes on.
    with pytest.raises(Timeout):
        await client.call("blob", {"size": 50_000_000}, timeout_s=0.001)
    assert client.failed_reason is None
    assert (await client.call("echo", {"b": 2})).json() == {"b": 2}


async def test_many_calls_at_once(client: AgentClient) -> None:
    results = await asyncio.gather(*(client.call("echo", {"i": i}) for i in range(300)))
    assert [r.json() for r in results] == [{"i": i} for i in range(300)]


async def test_closing_the_client_ends_a_call_in_flight(agent_socket: Path) -> None:
    """A call waiting on the call stream when the host closes the connection (a session
    being deleted) ends at once, with the reason, not at its deadline."""
    client = await AgentClient.connect_unix(str(agent_socket))
    waiting = asyncio.create_task(client.call("sleep", {"s": 30}, timeout_s=60))
    await asyncio.sleep(0.2)
    started = time.monotonic()
    await client.close()
    with pytest.raises(AgentFailed, match="closed by the host"):
        await waiting
    assert time.monotonic() - started < 1


async def test_calls_share_one_stream_that_survives_refusals(client: AgentClient) -> None:
    """Calls go over one call stream (POST /v1/calls), in turn; a refused call (too large,
    unknown, a handler's bug) answers on that stream and the next call uses it still;
    a call given up (its timeout) drops the stream, and the next opens a new one."""
    await client.call("echo", {})
    stream = client._calls._stream
    assert stream is not None
    with pytest.raises(InvalidRequest, match="exceeds 1048576 bytes"):
        await client.call("echo", {"data": "x" * (2 << 20)})
    with pytest.raises(NotFound):
        await client.call("nothing")
    with pytest.raises(SessionFailed, match="a handler bug"):
        await client.call("boom")
    assert (await client.call("echo", {"after": 1})).json() == {"after": 1}
    assert client._calls._stream is stream
    with pytest.raises(Timeout):
        await client.call("blob", {"size": 50_000_000}, timeout_s=0.001)
    assert (await client.call("echo", {"again": 1})).json() == {"again": 1}
    assert client._calls._stream is not stream and client.failed_reason is None


async def test_files_round_trip(client: AgentClient, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    target = tmp_path / "sub" / "f.bin"
    target.parent.mkdir()
    assert await client.write_file(str(target), data, mode=0o600) == len(data)
    assert target.read_bytes() == data and target.stat().st_mode & 0o777 == 0o600
    assert await client.read_file(str(target), len(data)) == data

    async def parts() -> object:
        for i in range(10):
            yield bytes([i]) * 100_000

    assert await client.write_file(str(target), parts()) == 1_000_000  # type: ignore[arg-type]
    got = await client.read_file(str(target), 1 << 20)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(
        b"".join(bytes([i]) * 100_000 for i in range(10))).hexdigest()
    assert list(target.parent.iterdir()) == [target]  # no temporary file left


async def test_file_caps_and_errors(client: AgentClient, tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(InvalidRequest, match="exceeds 1000 bytes"):
        await client.write_file(str(target), b"n" * 5_000_000, max_bytes=1000)
    assert target.read_bytes() == b"old"  # a refused upload leaves the file as it was
    assert os.listdir(tmp_path) == ["f"]
    big = tmp_path / "big"
    big.write_bytes(b"b" * 10_000)
    with pytest.raises(InvalidRequest, match="over 9999"):
        await client.read_file(str(big), 9999)
    with pytest.raises(NotFound):
        await client.read_file(str(tmp_path / "missing"), 100)
    with pytest.raises(InvalidRequest, match="not a regular file"):
        await client.read_file(str(tmp_path), 100)
    with pytest.raises(InvalidRequest):
        await client.read_file("relative/path", 100)
    assert await client.read_file(str(target), 100) == b"old"


async def test_a_file_that_shrinks_while_read_cuts_that_download_only(
    client: AgentClient, tmp_path: Path
) -> None:
    """A log rotated under a download: fewer bytes than the content-length sent broke the
    connection's HTTP/2 framing, and the host failed the whole agent."""
    target = tmp_path / "log"
    target.write_bytes(b"l" * (32 << 20))  # far more than the stream's window
    reader = await client.open_file(str(target), 64 << 20)
    received = 0
    try:
        with pytest.raises(SessionFailed, match="reset"):
            async for chunk in reader.chunks():
                if not received:
                    target.write_bytes(b"")  # truncated, as logrotate's copytruncate does
                received += len(chunk)
    finally:
        reader.close()
    assert received < 32 << 20
    assert client.failed_reason is None
    assert await client.read_file(str(target), 100) == b""


async def test_a_file_that_fails_to_read_is_an_error_not_a_failed_agent(
    client: AgentClient,
) -> None:
    """/proc/self/mem says size 0 and its read fails (EIO): a 500 before, which the host
    takes for a broken agent."""
    with pytest.raises(InvalidRequest, match="EIO"):
        await client.read_file("/proc/self/mem", 1000)
    assert client.failed_reason is None
    assert await client.health() >= 0


async def test_exec_ends_with_the_command_not_with_a_leftover(
    client: AgentClient, tmp_path: Path
) -> None:
    """A daemon the command left behind keeps its output pipe open: the status comes when
    the command exits (plus the drain grace), not when the daemon does."""
    pid_file = tmp_path / "daemon.pid"
    started = time.monotonic()
    try:
        chunks, status = await run(client, [
            "sh", "-c", f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 30' & echo done"
        ], timeout_s=20)
        assert time.monotonic() - started < 5
        assert status.exit_code == 0 and not status.timed_out
        assert b"".join(c.data for c in chunks) == b"done\n"
    finally:
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text().strip():
                os.kill(int(pid_file.read_text()), 9)
                break
            await asyncio.sleep(0.05)


async def test_exec_ends_with_the_command_even_if_a_leftover_writes_on(
    client: AgentClient, tmp_path: Path
) -> None:
    """A child in the background that never stops writing (a server started with `&`):
    the output is read for half a second more, then the status comes. The drain gave up
    only on a pipe that fell silent, so this exec never ended, not even at its timeout."""
    pid_file = tmp_path / "writer.pid"
    started = time.monotonic()
    try:
        chunks, status = await run(client, [
            "sh", "-c", f"(trap '' PIPE; while :; do echo x || exit; done) & "
                        f"echo $! > {pid_file}; echo started"], timeout_s=5)
        assert time.monotonic() - started < 3
        assert status.exit_code == 0 and not status.timed_out
        assert b"started\n" in b"".join(c.data for c in chunks)
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), 9)


async def test_files_replaced_keep_their_mode_and_directories_are_refused(
    client: AgentClient, tmp_path: Path
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")
    target.chmod(0o750)
    assert await client.write_file(str(target), b"new", mode=None) == 3
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o750
    fresh = tmp_path / "fresh"
    assert await client.write_file(str(fresh), b"x", mode=None) == 1
    assert fresh.stat().st_mode & 0o777 == 0o644
    with pytest.raises(InvalidRequest, match="is a directory"):
        await client.write_file(str(tmp_path), b"x")
    reader = await client.open_file(str(target), 100)
    try:
        assert reader.size == 3
        assert b"".join([chunk async for chunk in reader.chunks()]) == b"new"
    finally:
        reader.close()
    with pytest.raises(NotFound):
        await client.open_file(str(tmp_path / "missing"), 100)


def test_h2speed_changes_no_output() -> None:
    """The cheaper repr of frame payloads (deskbox_agent/h2speed.py, both ends) says exactly
    what h2's did."""
    import binascii

    from deskbox_agent.h2speed import short_data_repr

    def original(data: bytes | None) -> str:  # hyperframe 6.1's _raw_data_repr
        if not data:
            return "None"
        r = binascii.hexlify(data).decode("ascii")
        if len(r) > 20:
            r = r[:20] + "..."
        return "<hex:" + r + ">"

    for size in (0, 1, 9, 10, 11, 12, 100, 140 * 1024):
        data = bytes(range(256)) * (size // 256 + 1)
        assert short_data_repr(data[:size]) == original(data[:size])
    assert short_data_repr(None) == original(None)


def test_closing_after_the_loop_closed_the_transport_is_no_error(agent_socket: Path) -> None:
    """A killed sandbox resets the agent's socket, and the server's loop (uvloop) closes
    the transport before the client's read loop has run. A delete at that moment closed
    the client, whose goodbye write raised there, and the sandbox was never destroyed (its
    runc container and session directory were left)."""
    async def scenario() -> None:
        client = await AgentClient.connect_unix(str(agent_socket))
        client._conn._writer.transport.close()  # as the loop does on the peer's reset
        await asyncio.sleep(0)  # the handle closed; the read loop's turn not yet come
        await client.close()
        assert client.failed_reason is not None

    # The server's loop (serve.py); asyncio's own drops such a write.
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
