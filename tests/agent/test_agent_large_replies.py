"""Large replies back to back on one connection: each must arrive whole, none may stall.

A 4 MB reply (a grab's raw frame) is four stream windows: the agent sends, waits for the
host's WINDOW_UPDATE, sends again. A wakeup lost in that wait stalls the reply for good.
"""

from __future__ import annotations

import asyncio

from deskbox_server.agent import AgentClient


async def test_forty_4mb_replies_in_a_row_all_arrive(client: AgentClient) -> None:
    for _ in range(40):
        await client.call("echo", {})
        async with asyncio.timeout(10):
            result = await client.call("blob", {"size": 4_096_000})
        assert len(result.body) == 4_096_000
