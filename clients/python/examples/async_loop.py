"""An action loop over the websocket fast path, with the async client.

    DESKBOX_URL=http://127.0.0.1:8765 DESKBOX_API_KEY=... python async_loop.py
"""

from __future__ import annotations

import asyncio
import time

from deskbox import AsyncDeskbox


async def main() -> None:
    async with AsyncDeskbox() as box:
        async with await box.sessions.create() as session:
            async with session.actions_ws():  # every action below is one websocket message
                started = time.perf_counter()
                for x in range(0, 1280, 16):
                    await session.move(x, 400)
                elapsed = time.perf_counter() - started
                shot = await session.screenshot(format="jpeg")
            print(f"80 moves in {elapsed:.2f} s; screenshot of {len(shot)} bytes")


if __name__ == "__main__":
    asyncio.run(main())
