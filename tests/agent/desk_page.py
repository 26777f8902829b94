"""The event page on a real desktop driven by the real agent: Xvfb + openbox + Chromium on
this host (tests/local_desktop.py), the agent (``python -m deskbox_agent --display :N``) as
a subprocess with its pinned wheels, and the host's ``AgentDesktop`` over the real protocol.
The page's DOM is read through DevTools, so a test checks what the page received.

conftest.py has the fixtures (``page``, ``desk``: module-scoped, each module gets its own
desktop).
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.errors import DesktopFailed
from deskbox_server.media import EncodedImage
from deskbox_server.schemas import actions as a

from ..cdp_page import CdpPage

__all__ = ["EVENTS_PAGE", "Page", "colours", "decode"]

EVENTS_PAGE = (Path(__file__).parent.parent / "pages" / "events.html").as_uri()


class Page:
    """The event page in the desktop's browser: loaded, and its origin measured by a click."""

    def __init__(self, desk: AgentDesktop, cdp: CdpPage) -> None:
        self.desk, self.cdp = desk, cdp
        self.origin = (0, 0)

    async def load(self) -> None:
        url = f"{EVENTS_PAGE}?load={time.monotonic_ns()}"
        self.cdp.navigate(url)
        await self.until(f"location.href === {url!r} && document.readyState === 'complete'")
        self.cdp.wait_painted()
        for _ in range(3):  # paint holding may swallow the first click of a new document
            await self.desk.perform(a.Click(x=640, y=700))
            clicks = await self.wait_for("click", 1, timeout_s=1.0)
            if clicks:
                self.origin = (clicks[0]["screenX"] - clicks[0]["clientX"],
                               clicks[0]["screenY"] - clicks[0]["clientY"])
                self.clear()
                return
        raise AssertionError("the page never received a click")

    def at(self, x: int, y: int) -> tuple[int, int]:
        return self.origin[0] + x, self.origin[1] + y

    def events(self, *types: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.cdp.evaluate("window.__events")
        return [e for e in events if not types or e["type"] in types]

    def clear(self) -> None:
        self.cdp.evaluate("window.__events.length = 0")

    def value(self) -> str:
        return str(self.cdp.evaluate("document.getElementById('field').value"))

    async def until(self, expression: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.cdp.evaluate(expression):
                    return
            except DesktopFailed:
                pass  # the context was torn down mid-navigation
            assert time.monotonic() < deadline, f"the page never satisfied {expression}"
            await asyncio.sleep(0.01)

    async def wait_for(self, kind: str, count: int, timeout_s: float = 5.0,
                       ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:  # the page is polled through DevTools: no event to wait on here
            found = self.events(kind)
            if len(found) >= count or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(0.01)

    async def until_events(self, predicate: Callable[[list[dict[str, Any]]], object],
                           timeout_s: float = 5.0) -> list[dict[str, Any]]:
        """The page's events once ``predicate`` holds for them (or the last ones seen)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.events()
            if predicate(found) or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(0.01)

    async def focus_field(self) -> None:
        x, y = self.at(900, 175)
        await self.desk.perform(a.Click(x=x, y=y))
        await self.wait_for("click", 1)
        self.cdp.evaluate("document.getElementById('field').value = ''")
        self.clear()


def decode(image: EncodedImage) -> Image.Image:
    decoded = Image.open(io.BytesIO(image.data))
    decoded.load()
    assert (decoded.width, decoded.height) == (image.width, image.height)
    return decoded.convert("RGB")


def colours(image: Image.Image) -> set[Any]:
    return {colour for _, colour in image.getcolors(1 << 24) or []}


