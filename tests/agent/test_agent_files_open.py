"""The agent opens a file to send off its event loop; a transfer cancelled while the open
runs in its thread (the host reset the stream) leaves no descriptor behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from deskbox_agent.files import _open_to_read


def _descriptors_of(path: Path) -> list[str]:
    """This process's descriptors open on ``path`` (only those: other tests' threads in
    the same process may open and close their own meanwhile)."""
    real = os.path.realpath(path)
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            if os.readlink(f"/proc/self/fd/{fd}") == real:
                found.append(fd)
    return found


async def test_an_open_cancelled_in_its_thread_closes_its_descriptor(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 10)
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
        if not _descriptors_of(target):
            break
        await asyncio.sleep(0.02)
    assert _descriptors_of(target) == []


async def test_an_open_returns_the_file_and_its_size(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"x" * 10)
    fd, st = await _open_to_read(str(target))
    try:
        assert st.st_size == 10 and os.read(fd, 20) == b"x" * 10
    finally:
        os.close(fd)
