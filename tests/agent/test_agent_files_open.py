"""The agent opens a file to send off its event loop; a transfer cancelled while the open
runs in its thread (the host reset the stream) leaves no descriptor behind."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from deskbox_agent.files import _open_to_read


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_an_open_cancelled_in_its_thread_closes_its_descriptor(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 10)
    before = _open_fds()
    for _ in range(20):
        opening = asyncio.create_task(_open_to_read(str(target)))
        await asyncio.sleep(0)  # the thread is started; cancel before it returns
        opening.cancel()
        try:
            fd, _ = await opening
            os.close(fd)  # the open won the race: the caller owns the descriptor
        except asyncio.CancelledError:
            pass
    for _ in range(100):
        if _open_fds() <= before:
            break
        await asyncio.sleep(0.02)
    assert _open_fds() <= before


async def test_an_open_returns_the_file_and_its_size(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 10)
    fd, st = await _open_to_read(str(target))
    try:
        assert st.st_size == 10 and os.read(fd, 20) == b"x" * 10
    finally:
        os.close(fd)
