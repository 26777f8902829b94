"""Raw byte channels through the real agent: to a TCP port and to a unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest
import pytest_asyncio

from deskbox_server.agent import AgentClient, AgentLimits, Channel
from deskbox_server.errors import Conflict

MIB = 1024 * 1024


_writers: set[asyncio.StreamWriter] = set()  # closed by each test's fixture teardown


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    _writers.add(writer)
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _close_all(writers: Iterable[asyncio.StreamWriter]) -> None:
    """Close the server side of test connections and wait until their sockets are: they are
    released on the loop's next turns, and one that outlives the test's loop is collected
    later, a ResourceWarning in whatever test runs then."""
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@pytest_asyncio.fixture(loop_scope="function")
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]
    await _close_all(list(_writers))  # Python 3.11 leaves a server's connections open
    _writers.clear()


async def _read_exactly(channel: Channel, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = await channel.read()
        assert chunk, f"the channel ended after {len(out)} of {size} bytes"
        out += chunk
    return bytes(out)


async def test_tcp_channel_both_ways(client: AgentClient, echo_port: int) -> None:
    channel = await client.open_tcp(echo_port)
    await channel.write(b"ping")
    assert await _read_exactly(channel, 4) == b"ping"
    await channel.write_eof()  # half-close: the echo server sees EOF and closes its side
    assert await channel.read() == b""
    channel.close()
    assert (await client.call("echo", {"still": "up"})).json() == {"still": "up"}


async def test_tcp_channel_large_transfer(client: AgentClient, echo_port: int) -> None:
    """64 MiB through the agent and back, writer and reader at once: flow control only."""
    data = os.urandom(MIB) * 64
    channel = await client.open_tcp(echo_port)

    async def write() -> None:
        for i in range(0, len(data), 256 * 1024):
            await channel.write(data[i : i + 256 * 1024])
        await channel.write_eof()

    writer = asyncio.create_task(write())
    got = hashlib.sha256()
    size = 0
    while chunk := await channel.read():
        got.update(chunk)
        size += len(chunk)
    await writer
    assert size == len(data) and got.digest() == hashlib.sha256(data).digest()
    channel.close()


async def test_a_channel_nobody_reads_stays_within_its_window(client: AgentClient) -> None:
    """A socket that never reads: the agent stops at the window, the host's writer waits."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    channel = await client.open_tcp(server.sockets[0].getsockname()[1])
    written = 0

    async def write() -> None:
        nonlocal written
        while True:
            await channel.write(b"w" * 65536)
            written += 65536

    writer = asyncio.create_task(write())
    last, still_since = -1, asyncio.get_running_loop().time()
    for _ in range(200):
        await asyncio.sleep(0.05)
        now = asyncio.get_running_loop().time()
        if written != last:
            last, still_since = written, now
        elif now - still_since > 1.0:
            break
    else:
        raise AssertionError(f"the writer was never held back ({written} bytes written)")
    # What waits on the way is bounded: the agent's stream window, one relay chunk and the
    # kernel's socket buffers.
    assert written < 16 * MIB, written
    writer.cancel()
    await asyncio.gather(writer, return_exceptions=True)
    channel.close()
    await _close_all(held)
    server.close()
    await server.wait_closed()
    assert (await client.call("echo", {})).json() == {}


async def test_many_channels_at_once(client: AgentClient, echo_port: int) -> None:
    channels = await asyncio.gather(*(client.open_tcp(echo_port) for _ in range(40)))
    for i, channel in enumerate(channels):
        await channel.write(b"%d;" % i)
    for i, channel in enumerate(channels):
        assert await _read_exactly(channel, len(b"%d;" % i)) == b"%d;" % i
        channel.close()


async def test_unix_channel(client: AgentClient, tmp_path: Path) -> None:
    path = str(tmp_path / "vnc.sock")
    server = await asyncio.start_unix_server(_echo, path)
    async with server:
        channel = await client.open_unix(path)
        payload = os.urandom(3 * MIB)

        async def write() -> None:
            await channel.write(payload)
            await channel.write_eof()

        writer = asyncio.create_task(write())
        assert await _read_exactly(channel, len(payload)) == payload
        await writer
        assert await channel.read() == b""
        channel.close()


async def test_channel_to_nothing(client: AgentClient, tmp_path: Path) -> None:
    with pytest.raises(Conflict, match="connect_failed"):
        await client.open_unix(str(tmp_path / "none.sock"))
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(Conflict, match="connect_failed"):
        await client.open_tcp(port)
    assert (await client.call("echo", {})).json() == {}


async def test_channels_nobody_reads_do_not_block_the_rest(client: AgentClient) -> None:
    """Sockets that send without end, into channels the host never reads: each channel
    stops at its own window, and calls and other channels on the connection go on."""
    sending: list[asyncio.StreamWriter] = []

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sending.append(writer)
        try:
            while True:
                writer.write(b"f" * 65536)
                await writer.drain()
        except ConnectionError:
            pass

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channels = [await client.open_tcp(port) for _ in range(12)]  # 12 windows > connection's
    await asyncio.sleep(1.0)
    held = [len(c._stream._body) for c in channels]
    assert all(h <= AgentLimits().stream_window for h in held), held
    assert sum(held) > AgentLimits().connection_window, held  # more than one window's worth
    async with asyncio.timeout(2):
        assert (await client.call("blob", {"size": 3 * MIB})).body == b"\x5a" * 3 * MIB
        assert len(await channels[0].read(10)) == 10  # and a stalled one resumes
    for channel in channels:
        channel.close()
    await _close_all(sending)
    server.close()
    await server.wait_closed()


async def test_channels_given_up_while_full_are_no_flood(client: AgentClient) -> None:
    """A host that closes busy channels one after another (DevTools clients dropped for
    reading too slowly) still receives the DATA the agent sent before it saw each reset,
    up to that stream's window: h2 drops those frames without an event, and they must not
    count against the flood budget (once, that failed a session with a good agent)."""
    sending: list[asyncio.StreamWriter] = []

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sending.append(writer)
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"f" * 65536)
                await writer.drain()

    server = await asyncio.start_server(flood, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    for _ in range(40):  # 40 windows of 16 KiB frames: far over the burst of 1,000 frames
        channel = await client.open_tcp(port)
        # Read for a while, so that the window keeps being handed back and the agent has
        # a window's worth on the way when the channel is closed.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                while await channel.read():
                    pass
        channel.close()
    await asyncio.sleep(0.5)
    assert client.failed_reason is None
    assert (await client.call("echo", {"after": True})).json() == {"after": True}
    await _close_all(sending)
    server.close()
    await server.wait_closed()


async def test_sockets_that_do_not_read_do_not_block_the_rest(
    client: AgentClient, echo_port: int
) -> None:
    """The other way: the host writes into 12 channels whose sockets never read. Each stops
    at its own window in the agent; calls and a fresh channel go on."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channels = [await client.open_tcp(port) for _ in range(12)]

    async def fill(channel: Channel) -> None:
        while True:
            await channel.write(b"h" * 65536)

    fillers = [asyncio.create_task(fill(c)) for c in channels]
    await asyncio.sleep(2.0)
    async with asyncio.timeout(2):
        assert (await client.call("echo", {"ok": True})).json() == {"ok": True}
        fresh = await client.open_tcp(echo_port)
        await fresh.write(b"still flowing")
        assert await _read_exactly(fresh, 13) == b"still flowing"
        fresh.close()
    for task in fillers:
        task.cancel()
    await asyncio.gather(*fillers, return_exceptions=True)
    for channel in channels:
        channel.close()
    await _close_all(held)
    server.close()
    await server.wait_closed()
