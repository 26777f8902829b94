"""Where the keyboard goes: the origin of the focused editable field, read through the
browser's DevTools before a secret is typed (API.md "Secrets").

A secret is typed only where a page of one of its allowed origins has the focus, in an
editable field of a frame of that same origin. The page's own script answers the question,
so a hostile page could lie about itself; it cannot lie for another origin's page, and that
is what the check is for: a model talked into typing a password elsewhere is refused.

A frame of another site runs in a renderer of its own (site isolation): the page learns
that such a frame took the focus only after that renderer has handled the click, so a frame
whose ``mousedown`` handler stays busy would be checked on the page's focus from before,
and the keystrokes that follow would reach it. Every such frame of the focused page is
asked too, which waits for its renderer to finish what it is doing; one that has the
focus, or that does not answer, is refused as any frame of another origin is.
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
_MAX_FRAMES = 32  # out-of-process frames asked; a browser with more is refused
# The focus in a frame of another site than its page, or maybe there (a frame that did not
# answer, or too many to ask): a frame chain of more than one origin, never a secret's.
_ANOTHER_ORIGINS_FRAME = (None, False)
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
    targets = [t for t in listing if isinstance(t, dict)] if isinstance(listing, list) else []
    focused_page, page_focus = None, None
    for page in [t for t in targets if t.get("type") == "page"][:_MAX_PAGES]:
        answered, focus = await _focus_of(open_devtools, page)  # the most recent page first
        if answered and focus is not None:
            focused_page, page_focus = page.get("id"), focus
            break
    if page_focus is None:
        return None
    # The frames of other sites inside that page (another tab's, hung or not, are not where
    # the keyboard goes), all at once: each waits for its renderer.
    by_id = {t.get("id"): t for t in targets}
    frames = [t for t in targets
              if t.get("type") == "iframe" and _inside(t, focused_page, by_id)]
    if len(frames) > _MAX_FRAMES:
        return _ANOTHER_ORIGINS_FRAME
    for answered, focus in await asyncio.gather(*(_focus_of(open_devtools, frame)
                                                  for frame in frames)):
        if not answered or focus is not None:
            return _ANOTHER_ORIGINS_FRAME
    return page_focus


def _inside(frame: dict[str, Any], page_id: object, by_id: dict[Any, dict[str, Any]]) -> bool:
    """Whether ``frame`` is in the page ``page_id`` (its ``parentId`` chain through the
    targets ``by_id``); a chain that cannot be followed counts as inside: better a frame
    asked for nothing than one missed."""
    target = frame
    for _ in range(32):
        parent = target.get("parentId")
        if parent is None or parent == page_id or parent not in by_id:
            return True
        target = by_id[parent]
        if target.get("type") == "page":
            return False  # another page's
    return True


async def _focus_of(open_devtools: Opener, target: dict[str, Any]
                    ) -> tuple[bool, tuple[str | None, bool] | None]:
    """(answered, (origin, editable) or None where the target's document has no focus)."""
    path = urlsplit(str(target.get("webSocketDebuggerUrl", ""))).path
    if not _PAGE_PATH.match(path):
        return False, None
    answered, answer = await _evaluate(open_devtools, path)
    if not isinstance(answer, dict):
        return answered and answer is None, None
    origin = answer.get("origin")
    return True, (origin if isinstance(origin, str) else None, answer.get("editable") is True)


async def _evaluate(open_devtools: Opener, path: str) -> tuple[bool, Any]:
    """(whether the target answered, the value FOCUS evaluated to)."""
    try:
        connection = await open_websocket(open_devtools, path, _MAX_ANSWER, _TIMEOUT_S)
    except DeskboxError:
        return False, None
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            await connection.send(json.dumps({"id": 1, "method": "Runtime.evaluate", "params": {
                "expression": FOCUS, "returnByValue": True}}))
            while True:
                message = untrusted_json.loads(await connection.recv())
                if isinstance(message, dict) and message.get("id") == 1:
                    reply = message.get("result")
                    result = reply.get("result") if isinstance(reply, dict) else None
                    if not isinstance(result, dict) or "value" not in result:
                        return False, None
                    return True, result["value"]
    except (TimeoutError, ValueError, WebSocketException, OSError, BrowserUnavailable):
        return False, None
    finally:
        await connection.close()
