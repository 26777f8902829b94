"""A runc sandbox's desktop through its agent, for tests that start sandboxes themselves.

``ContainerSandbox.start`` returns once the agent listens; the backend then asks the agent
whether the desktop is ready (window manager, browser painted) and applies the session's
own CPU quota. Tests that start sandboxes directly do the same with :func:`wait_ready`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.backends.agent_link import connect_agent
from deskbox_server.backends.container import ContainerSandbox


@asynccontextmanager
async def agent_desktop(box: ContainerSandbox) -> AsyncIterator[AgentDesktop]:
    """The sandbox's desktop through a connection of our own to its agent."""
    client = await connect_agent(box)
    try:
        yield AgentDesktop(client)
    finally:
        await client.close()


async def wait_ready(box: ContainerSandbox, browser: bool = True) -> dict[str, float]:
    """Until the agent says the desktop is ready (as the backend waits), then the session's
    own limits: ContainerSandbox.start returns once the agent listens."""
    async with agent_desktop(box) as desktop:
        stages = await desktop.ready(browser, 30.0)
    await asyncio.to_thread(box.apply_limits)
    return stages


def until_ready(box: ContainerSandbox, browser: bool = True) -> ContainerSandbox:
    """``box`` once its desktop is ready (from synchronous code)."""
    asyncio.run(wait_ready(box, browser))
    return box
