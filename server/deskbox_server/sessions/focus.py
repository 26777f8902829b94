"""Where the keyboard goes: the origin of the focused editable field, read through the
browser's DevTools before a secret is typed (API.md "Secrets").

A secret is typed only where a page of one of its allowed origins has the focus, in an
editable field of a frame of that same origin. The page's own script answers the question,
so a hostile page could lie about itself; it cannot lie for another origin's page, and that
is what the check is for: a model talked into typing a password elsewhere is refused.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import urlsplit

from websockets.exceptions import WebSocketException

from .. import untrusted_json
from ..agent.devtools import MAX_LISTING, Opener, get_json, open_websocket
from ..errors import BrowserUnavailable, DeskboxError

__all__ = ["focused_field_origin"]

_PAGE_PATH = re.compile(r"^/devtools/page/[A-Za-z0-9-]{1,64}$")
_MAX_PAGES = 8
_TIMEOUT_S = 5.0
_MAX_ANSWER = 64 * 1024

# The focused frame chain from the top document down: a cross-origin frame cannot be looked
# into (contentDocument is null), which counts as "not this origin's field".
FOCUS = r"""(() => {
  if (!document.hasFocus()) return null;
  let doc = document;
  for (let depth = 0; depth < 16; depth++) {
    const el = doc.activeElement;
    if (el && (el.tagName === "IFRAME" || el.tagName === "FRAME")) {
      let inner = null;
      try { inner = el.contentDocument; } catch (e) {}
      if (!inner) return {origin: null, editable: false};
      doc = inner;
      continue;
    }
    const plain = ["button", "checkbox", "radio", "submit", "reset", "file", "image",
                   "range", "color", "hidden"];
    const editable = !!el && (el.isContentEditable || el.tagName === "TEXTAREA" ||
                              (el.tagName === "INPUT" && !plain.includes(el.type)));
    return {origin: doc.location.origin, editable: editable};
  }
  return {origin: null, editable: false};
})()"""


async def focused_field_origin(open_devtools: Opener) -> tuple[str | None, bool] | None:
    """(origin, editable) of what has the keyboard focus in the browser, or None when no
    page has it (the address bar, another window, no browser) or the browser does not say
    within a few seconds in all (a page stuck in a script answers nothing)."""
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            return await _ask(open_devtools)
    except TimeoutError:
        return None


async def _ask(open_devtools: Opener) -> tuple[str | None, bool] | None:
    try:
        listing = await get_json(await open_devtools(), "/json/list", MAX_LISTING)
    except DeskboxError:
        return None
    pages = [t for t in listing if isinstance(t, dict) and t.get("type") == "page"] \
        if isinstance(listing, list) else []
    for page in pages[:_MAX_PAGES]:  # the most recently active first
        path = urlsplit(str(page.get("webSocketDebuggerUrl", ""))).path
        if not _PAGE_PATH.match(path):
            continue
        answer = await _evaluate(open_devtools, path)
        if isinstance(answer, dict):
            origin = answer.get("origin")
            return (origin if isinstance(origin, str) else None,
                    answer.get("editable") is True)
    return None


async def _evaluate(open_devtools: Opener, path: str) -> Any:
    try:
        connection = await open_websocket(open_devtools, path, _MAX_ANSWER, _TIMEOUT_S)
    except DeskboxError:
        return None
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            await connection.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {
                "expression": FOCUS, "returnByValue": True}}))
            while True:
                message = untrusted_json.loads(await connection.recv())
                if isinstance(message, dict) and message.get("id") == 1:
                    return message.get("result", {}).get("result", {}).get("value")
    except (TimeoutError, ValueError, WebSocketException, OSError, BrowserUnavailable):
        return None
    finally:
        await connection.close()
