"""The local engine: host processes driven through an agent that it starts itself
(``python -m deskbox_agent`` on a socket in the desktop's private directory)."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from deskbox_server.agent.devtools import get_json
from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.local.engine import LocalEngine
from deskbox_server.engines.local.sandbox import LocalSandbox
from deskbox_server.errors import DesktopFailed, InvalidRequest, SessionFailed
from deskbox_server.media import EncodedImage
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Size
from deskbox_server.sessions.desktop import AnyDesktop, Desktop

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture(loop_scope="function")
async def handle() -> AsyncIterator[AnyDesktop]:
    spec = SessionSpec("ses_local", DesktopSpec(width=800, height=600))
    made = await Desktop.start(LocalEngine(), spec, 30)
    assert isinstance(made.sandbox, LocalSandbox)
    try:
        yield made
    finally:
        await made.destroy()
        assert not made.sandbox.workdir.exists()


async def test_a_desktop_through_its_own_agent(handle: AnyDesktop) -> None:
    result = await handle.run([a.ScreenSize()], screenshot=a.Screenshot(format="png"))
    assert result.results == [Size(width=800, height=600)]
    assert isinstance(result.screenshot, EncodedImage)
    assert (result.screenshot.width, result.screenshot.height) == (800, 600)
    assert handle.failure() is None
    # The agent's socket is in a directory only this user can enter.
    mode = stat.S_IMODE(os.stat(handle.sandbox.workdir).st_mode)
    assert mode == 0o700 and handle.sandbox.agent_socket.parent == handle.sandbox.workdir
    names = {child.name for child in handle.sandbox.processes.children}
    assert names == {"Xvfb", "openbox", "chromium", "deskbox-agent"}


async def test_exec_and_files_are_refused(handle: AnyDesktop) -> None:
    with pytest.raises(InvalidRequest, match="which the local engine lacks.*never runs commands"):
        await handle.read_file("/etc/hostname", 100)


async def test_devtools_through_the_agent(handle: AnyDesktop) -> None:
    devtools = await handle.open_devtools()
    try:
        version = await get_json(devtools, "/json/version", 1 << 16)
        assert isinstance(version, dict) and "Chrome" in str(version.get("Browser"))
    finally:
        devtools.close()


@pytest.mark.parametrize("victim", ["Xvfb", "openbox", "chromium", "deskbox-agent"])
async def test_a_killed_process_fails_the_desktop(handle: AnyDesktop, victim: str) -> None:
    child = next(c for c in handle.sandbox.processes.children if c.name == victim)
    os.kill(child.popen.pid, signal.SIGKILL)
    child.popen.wait(timeout=5)
    failure = handle.failure()
    assert failure is not None and victim in failure and "signal 9" in failure
    if victim in ("openbox", "chromium"):
        return  # the agent still drives the display: the session fails by failure() alone
    with pytest.raises((DesktopFailed, SessionFailed)):
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the agent may answer once more while X dies
            await handle.run([a.Screenshot(format="png")])
