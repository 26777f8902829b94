"""A runc sandbox's desktop through its agent, for tests that start sandboxes themselves.

``RuncSandbox.start`` returns once the agent listens; the backend then asks the agent
whether the desktop is ready (window manager, browser painted) and applies the session's
own CPU quota. Tests that start sandboxes directly do the same with :func:`wait_ready`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from deskbox_server.agent.client import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.agent.limits import AgentLimits
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.engines.runc.stream import open_agent_stream


async def connect_agent(box: RuncSandbox, limits: AgentLimits | None = None) -> AgentClient:
    """A new connection of our own to the sandbox's agent, as sessions/desktop.py makes one:
    the runc engine's stream, then the protocol's handshake."""
    limits = limits or AgentLimits()
    reader, writer = await open_agent_stream(box, limits.read_chunk)
    return await AgentClient.connect(reader, writer, limits)


@asynccontextmanager
async def agent_desktop(box: RuncSandbox) -> AsyncIterator[AgentDesktop]:
    """The sandbox's desktop through a connection of our own to its agent."""
    client = await connect_agent(box)
    try:
        yield AgentDesktop(client)
    finally:
        await client.close()


async def wait_ready(box: RuncSandbox, browser: bool = True) -> dict[str, float]:
    """Until the agent says the desktop is ready (as the backend waits), then the session's
    own limits: RuncSandbox.start returns once the agent listens."""
    async with agent_desktop(box) as desktop:
        stages = await desktop.ready(browser, 30.0)
    await asyncio.to_thread(box.apply_limits)
    return stages


def until_ready(box: RuncSandbox, browser: bool = True) -> RuncSandbox:
    """``box`` once its desktop is ready (from synchronous code)."""
    asyncio.run(wait_ready(box, browser))
    return box
