"""A sandboxed desktop starts its agent, shows its browser, and the agent drives it."""

from __future__ import annotations

import io

from PIL import Image

from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.media import EncodedImage
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Point

from .conftest import agent_desktop


async def test_the_sandbox_starts_its_agent_and_the_desktop_is_ready(
    sandbox: RuncSandbox,
) -> None:
    assert sandbox.failure() is None
    assert {"runc", "socket", "agent"} <= set(sandbox.timings)
    async with agent_desktop(sandbox) as desktop:
        stages = await desktop.ready(True, 10.0)  # ready already: it answers at once
        info = await desktop.info()
    assert set(stages) == {"xserver", "wm", "browser", "painted"}
    assert (info.width, info.height) == (1280, 800) and info.capture == "xshm"


async def test_screenshot_shows_the_browser_window(sandbox: RuncSandbox) -> None:
    async with agent_desktop(sandbox) as desktop:
        shot = await desktop.perform(a.Screenshot(format="png"))
    assert isinstance(shot, EncodedImage)
    image = Image.open(io.BytesIO(shot.data)).convert("RGB")
    assert image.size == (1280, 800)
    # The browser's toolbar is drawn: many colours at the top, not an empty X root.
    toolbar = image.crop((0, 0, 1280, 90))
    colours = toolbar.getcolors(maxcolors=1 << 16) or []
    assert len(colours) > 8


async def test_input_reaches_the_sandboxed_display(sandbox: RuncSandbox) -> None:
    async with agent_desktop(sandbox) as desktop:
        await desktop.perform(a.Move(x=321, y=123))
        position = await desktop.perform(a.CursorPosition())
    assert isinstance(position, Point) and (position.x, position.y) == (321, 123)
