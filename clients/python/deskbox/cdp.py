"""A session's browser tabs through DevTools, from outside the model's view.

Task setups open their start page with it and evaluators read the page's state with it
(``deskbox.tasks``); anything else that wants one JavaScript value without Playwright can
too::

    from deskbox import cdp
    cdp.navigate(session, "file:///tmp/task/form.html")
    cdp.evaluate(session, "document.title")          # in the active tab
    cdp.evaluate(session, "window.done", page=r"/tab2\\.html$")

It speaks the proxied endpoints of API.md "DevTools (CDP)" with the client's credentials:
``/cdp/json/list`` for the tabs (Chromium lists the most recently active first) and one
short websocket per call to the tab's target.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from ._base import Call
from ._errors import DeskboxError
from ._sync import Session

__all__ = ["DevToolsError", "Page", "evaluate", "navigate", "pages"]


class DevToolsError(DeskboxError):
    """The browser could not answer: no such tab, a JavaScript exception, a closed socket."""


@dataclass(frozen=True)
class Page:
    id: str
    url: str
    title: str
    websocket_url: str


def pages(session: Session, *, timeout: float = 10) -> list[Page]:
    """The session's tabs, the most recently active first."""
    targets = session._client._send(Call("GET", f"{session._path}/cdp/json/list",
                                         timeout=timeout))
    return [Page(t["id"], t.get("url", ""), t.get("title", ""), t["webSocketDebuggerUrl"])
            for t in targets if t.get("type") == "page" and "webSocketDebuggerUrl" in t]


def page_matching(session: Session, pattern: str | None, *, timeout: float = 10) -> Page:
    """The active tab, or the most recently active one whose URL ``pattern`` finds."""
    tabs = pages(session, timeout=timeout)
    chosen = tabs if pattern is None else [p for p in tabs if re.search(pattern, p.url)]
    if not chosen:
        wanted = "a tab" if pattern is None else f"a tab whose URL matches {pattern!r}"
        raise DevToolsError(f"no {wanted} (tabs: {[p.url for p in tabs]})")
    return chosen[0]


def evaluate(session: Session, expression: str, *, page: str | None = None,
             timeout: float = 10) -> Any:
    """The JSON value of ``expression`` in a tab (a promise is awaited)."""
    target = page_matching(session, page, timeout=timeout)
    answer = _call(session, target, "Runtime.evaluate", {
        "expression": expression, "returnByValue": True, "awaitPromise": True,
    }, timeout)
    if "exceptionDetails" in answer:
        details = answer["exceptionDetails"]
        message = details.get("exception", {}).get("description") or details.get("text")
        raise DevToolsError(f"{expression!r} threw: {message}")
    return answer.get("result", {}).get("value")


def navigate(session: Session, url: str, *, timeout: float = 30) -> None:
    """Open ``url`` in the active tab and wait until it has loaded and been drawn."""
    target = page_matching(session, None, timeout=timeout)
    deadline = time.monotonic() + timeout
    answer = _call(session, target, "Page.navigate", {"url": url}, timeout)
    if answer.get("errorText"):
        raise DevToolsError(f"could not open {url}: {answer['errorText']}")
    while True:
        state = _call(session, target, "Runtime.evaluate", {
            "expression": "[document.readyState, location.href]", "returnByValue": True,
        }, timeout).get("result", {}).get("value")
        if state == ["complete", url]:
            # Two animation frames: the loaded page has been drawn, not only laid out.
            _call(session, target, "Runtime.evaluate", {
                "expression": "new Promise(r => requestAnimationFrame(() => "
                              "requestAnimationFrame(r)))",
                "awaitPromise": True,
            }, timeout)
            return
        if time.monotonic() > deadline:
            raise DevToolsError(f"{url} did not finish loading in {timeout:g} s (at {state})")
        time.sleep(0.05)


def _call(session: Session, target: Page, method: str, params: Mapping[str, Any],
          timeout: float) -> dict[str, Any]:
    message_id = 1  # one call per socket
    try:
        with connect(target.websocket_url, additional_headers=session._client.headers,
                     open_timeout=timeout, close_timeout=1, max_size=None,
                     **session._client._ws_options(target.websocket_url)) as socket:
            socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
            deadline = time.monotonic() + timeout
            while True:
                reply = json.loads(socket.recv(timeout=max(0.0, deadline - time.monotonic())))
                if reply.get("id") == message_id:
                    break
    except (OSError, TimeoutError, WebSocketException) as error:
        raise DevToolsError(f"{method} on tab {target.url!r}: {error}") from error
    if "error" in reply:
        raise DevToolsError(f"{method} on tab {target.url!r}: {reply['error'].get('message')}")
    result: dict[str, Any] = reply.get("result", {})
    return result
