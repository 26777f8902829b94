"""A small Chrome DevTools Protocol client: enough to see a page load and read its state.

Every reply is bounded in size: the browser runs inside the sandbox and is not trusted.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from contextlib import ExitStack
from typing import Any, cast

from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect

from deskbox_server.errors import DesktopFailed, Timeout

__all__ = ["CdpPage", "page_targets"]

MAX_MESSAGE = 16 * 1024 * 1024


def _get_json(url: str, timeout_s: float) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (loopback)
        return json.loads(response.read(MAX_MESSAGE))


def page_targets(http_base: str, timeout_s: float = 5.0) -> list[dict[str, str]]:
    """The browser's page targets, as ``/json/list`` reports them."""
    targets = _get_json(f"{http_base}/json/list", timeout_s)
    return [t for t in targets if t.get("type") == "page"]


class CdpPage:
    """A connection to one page target; use from a single thread."""

    def __init__(self, ws_url: str, timeout_s: float = 10.0) -> None:
        self._timeout_s = timeout_s
        self._stack = ExitStack()
        try:
            self._ws: ClientConnection = self._stack.enter_context(
                connect(ws_url, max_size=MAX_MESSAGE, open_timeout=timeout_s, compression=None)
            )
        except (OSError, WebSocketException) as error:
            raise DesktopFailed(f"cannot reach the browser's DevTools: {error}") from None
        self._ids = itertools.count(1)

    @classmethod
    def first(cls, http_base: str, timeout_s: float = 10.0) -> CdpPage:
        pages = page_targets(http_base, timeout_s)
        if not pages:
            raise DesktopFailed("the browser has no page open")
        return cls(pages[0]["webSocketDebuggerUrl"], timeout_s)

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        call_id = next(self._ids)
        self._ws.send(json.dumps({"id": call_id, "method": method, "params": params or {}}))
        while True:
            try:
                raw = self._ws.recv(timeout=self._timeout_s)
            except TimeoutError:
                raise Timeout(f"DevTools did not answer {method} in {self._timeout_s} s") from None
            message = json.loads(raw)
            if message.get("id") != call_id:
                continue  # an event, or a reply to a call we gave up on
            if "error" in message:
                raise DesktopFailed(f"DevTools {method} failed: {message['error']}")
            return cast(dict[str, Any], message.get("result", {}))

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": await_promise},
        )
        if "exceptionDetails" in result:
            raise DesktopFailed(f"page script failed: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def wait_painted(self, url_prefix: str = "", timeout_s: float = 10.0) -> None:
        """Return once a document (at ``url_prefix``) has loaded and drawn two frames.

        While the first page replaces about:blank its context can vanish under a call:
        that is retried, as is a document that is not the one asked for yet.
        """
        deadline = time.monotonic() + timeout_s
        script = (
            "new Promise(done => { const painted = () => requestAnimationFrame("
            "() => requestAnimationFrame(() => done(location.href)));"
            " if (document.readyState === 'complete') painted();"
            " else addEventListener('load', painted, {once: true}); })"
        )
        while True:
            try:
                href = self.evaluate(script, await_promise=True)
                if str(href).startswith(url_prefix):
                    return
            except DesktopFailed:
                pass
            if time.monotonic() > deadline:
                raise Timeout(f"the page {url_prefix or ''} was not painted in {timeout_s} s")
            time.sleep(0.02)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> CdpPage:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
