"""A stream to a pod's agent: TCP to the pod IP, then the token line the agent waits for
before it serves (PROTOCOL.md "A pod's agent: the token line")."""

from __future__ import annotations

import asyncio
import contextlib

from ...errors import AgentFailed

__all__ = ["connect_agent", "token_line"]

CONNECT_TIMEOUT_S = 5.0


def token_line(token: str) -> bytes:
    return b"DESKBOX-AGENT-TOKEN " + token.encode() + b"\n"


async def connect_agent(host: str, port: int, token: str, read_limit: int
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port, limit=read_limit)
    except (OSError, TimeoutError) as error:
        raise AgentFailed(f"the pod's agent at {host}:{port} does not answer "
                          f"({error or 'timed out'})") from None
    try:
        writer.write(token_line(token))
        await writer.drain()
    except OSError as error:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        raise AgentFailed(f"the pod's agent at {host}:{port} closed the connection "
                          f"({error})") from None
    return reader, writer
