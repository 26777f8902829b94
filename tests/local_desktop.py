"""A desktop of host processes for tests that start their own agent on it: the server's
LocalSandbox without its agent, returned once the browser's start page has painted (read
through DevTools; the test's agent then drives the display, the test itself speaks no X)."""

from __future__ import annotations

from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.local.sandbox import LocalSandbox

from .cdp_page import CdpPage

__all__ = ["HostDesktop"]

START_TIMEOUT_S = 30.0


class HostDesktop(LocalSandbox):
    def __init__(self, spec: DesktopSpec | None = None, browser: bool = True) -> None:
        super().__init__(spec, START_TIMEOUT_S, browser=browser, agent=False)
        if not browser:
            return
        try:
            self.port = self.wait_devtools_port(START_TIMEOUT_S)
            with CdpPage.first(self.devtools_url, START_TIMEOUT_S) as page:
                # Chromium may still show about:blank before it switches to the start URL.
                start = "" if self.spec.start_url == "about:blank" else self.spec.start_url[:8]
                page.wait_painted(url_prefix=start, timeout_s=START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> HostDesktop:
        return self
