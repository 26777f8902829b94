"""One real desktop (Xvfb + openbox + Chromium) per test module, and the event page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deskbox_server.driver.browser import CdpPage
from deskbox_server.driver.desktop import Desktop
from deskbox_server.driver.local import LocalDesktop
from deskbox_server.errors import DesktopFailed
from deskbox_server.schemas import actions as a

EVENTS_PAGE = (Path(__file__).parent.parent / "pages" / "events.html").as_uri()


class EventPage:
    """The event-recording page in the desktop's browser, read through DevTools."""

    def __init__(self, desktop: Desktop, page: CdpPage) -> None:
        self.desktop = desktop
        self.cdp = page
        self.origin = (0, 0)

    def load(self) -> None:
        # A fresh query string per load: until it shows in location, the old document (with
        # its own __events) may still be the one answering.
        self._loads = getattr(self, "_loads", 0) + 1
        url = f"{EVENTS_PAGE}?load={self._loads}"
        self.cdp.navigate(url)
        self.wait_until(f"location.href === {url!r} && document.readyState === 'complete'")
        self.cdp.wait_painted()
        self.origin = self._find_origin()
        self.clear()

    def _find_origin(self) -> tuple[int, int]:
        """Where the page's (0, 0) is on screen, measured with one real click."""
        # Chromium may still hold input back for a moment after a navigation's first frame
        # (paint holding); the measuring click is repeated until the new document gets one.
        for _ in range(3):
            self.desktop.perform(a.Click(x=640, y=700))
            clicks = self.wait_for(lambda es: [e for e in es if e["type"] == "click"], 1.0)
            if clicks:
                return clicks[0]["screenX"] - clicks[0]["clientX"], (
                    clicks[0]["screenY"] - clicks[0]["clientY"]
                )
        raise AssertionError("the freshly loaded page never received a click")

    def to_screen(self, client_x: int, client_y: int) -> tuple[int, int]:
        return self.origin[0] + client_x, self.origin[1] + client_y

    def events(self, *types: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.cdp.evaluate("window.__events")
        return [e for e in events if not types or e["type"] in types]

    def clear(self) -> None:
        self.cdp.evaluate("window.__events.length = 0")

    def value(self) -> str:
        return str(self.cdp.evaluate("document.getElementById('field').value"))

    def wait_until(self, expression: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._evaluate_quietly(expression):
            assert time.monotonic() < deadline, f"page never satisfied {expression}"
            time.sleep(0.01)

    def _evaluate_quietly(self, expression: str) -> Any:
        try:
            return self.cdp.evaluate(expression)
        except DesktopFailed:
            return None  # the context was torn down mid-navigation; ask again

    def wait_for(self, select: Any, timeout_s: float = 5.0) -> Any:
        """Poll the page until ``select(events)`` is truthy; events arrive asynchronously."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = select(self.events())
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    def focus_field(self) -> None:
        self.desktop.perform(a.Click(x=self.to_screen(900, 175)[0], y=self.to_screen(900, 175)[1]))
        self.wait_for(lambda es: [e for e in es if e["type"] == "click"])
        self.cdp.evaluate("document.getElementById('field').value = ''")
        self.clear()


@pytest.fixture(scope="module")
def local_desktop() -> Iterator[LocalDesktop]:
    with LocalDesktop() as desktop:
        yield desktop


@pytest.fixture(scope="module")
def cdp(local_desktop: LocalDesktop) -> Iterator[CdpPage]:
    with CdpPage.first(local_desktop.devtools_url) as page:
        yield page


@pytest.fixture
def page(local_desktop: LocalDesktop, cdp: CdpPage) -> EventPage:
    assert local_desktop.desktop is not None
    event_page = EventPage(local_desktop.desktop, cdp)
    event_page.load()
    return event_page


@pytest.fixture
def desktop(local_desktop: LocalDesktop) -> Desktop:
    assert local_desktop.desktop is not None
    return local_desktop.desktop
