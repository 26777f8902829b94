"""``POST /v1/channels/...``: raw byte channels, each one HTTP/2 stream.

The request body goes to the socket, the socket's bytes come back as the response body;
END_STREAM from the host half-closes the socket for writing, EOF from the socket ends the
response. The only buffers are HTTP/2's windows and one read chunk per direction.
"""

from __future__ import annotations

import asyncio
import contextlib

from .h2server import Stream, StreamGone
from .limits import Limits

__all__ = ["relay_tcp", "relay_unix"]

CHUNK = 64 * 1024


async def relay_tcp(stream: Stream, port: int, limits: Limits) -> None:
    try:
        async with asyncio.timeout(limits.channel_connect_timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=CHUNK)
    except (OSError, TimeoutError) as e:
        await stream.error(502, "connect_failed", f"127.0.0.1:{port}: {e!r}")
        return
    await _relay(stream, reader, writer)


async def relay_unix(stream: Stream, path: str, limits: Limits) -> None:
    try:
        async with asyncio.timeout(limits.channel_connect_timeout_s):
            reader, writer = await asyncio.open_unix_connection(path, limit=CHUNK)
    except (OSError, TimeoutError) as e:
        await stream.error(502, "connect_failed", f"{path}: {e!r}")
        return
    await _relay(stream, reader, writer)


async def _relay(
    stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    async def up() -> None:  # host -> socket
        while chunk := await stream.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def down() -> None:  # socket -> host
        while chunk := await reader.read(CHUNK):
            await stream.write(chunk)
        await stream.write(b"", end=True)

    try:
        await stream.respond(200, "application/octet-stream")
        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            for finished in asyncio.as_completed(tasks):
                await finished
        except (StreamGone, ConnectionError, OSError):
            stream.abort()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
