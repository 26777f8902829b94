"""The event page for sandboxed sessions, and how a test reads what it received.

A sandbox sees no host path and has no network, so the page goes in as a ``data:`` URL,
and its browser's DevTools are out of reach. The page therefore mirrors what a test needs
(clicks, the text field's value) into ``document.title``; Chromium puts the title into its
window's ``_NET_WM_NAME``, which the test reads over X from the host.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from Xlib import Xatom
from Xlib import display as xdisplay
from Xlib.xobject.drawable import Window

from deskbox_server.backends.container import ContainerOptions

__all__ = ["SandboxPage", "events_data_url", "read_display_number"]

EVENTS_HTML = Path(__file__).parent.parent / "pages" / "events.html"
_MIRROR = """
  const show = () => {
    const clicks = window.__events.filter((e) => e.type === 'click');
    const c = clicks[clicks.length - 1];
    document.title = JSON.stringify({
      clicks: clicks.length,
      click: c ? [c.clientX, c.clientY, c.screenX, c.screenY, c.button] : null,
      value: document.getElementById('field').value,
    });
  };
  for (const type of ['click', 'input']) addEventListener(type, show, { capture: true });
  show();
"""


def events_data_url() -> str:
    """tests/pages/events.html with the title mirror, as a ``data:`` URL."""
    html = EVENTS_HTML.read_text()
    html = html.replace("</script>", _MIRROR + "</script>", 1)
    return "data:text/html;base64," + base64.b64encode(html.encode()).decode()


def read_display_number(session_dir: Path) -> int:
    """The display of a container session (its directory in the server's state dir), from
    its shared tmpfs (``/run/deskbox/<container id>``, the id ends with the session's)."""
    found = list(ContainerOptions.shared_root.glob(f"*-{session_dir.name}/display/number"))
    assert len(found) == 1, found
    return int(found[0].read_text())


def top_level_clients(display: xdisplay.Display) -> list[Window]:
    """Client windows the window manager lists in ``_NET_CLIENT_LIST`` (EWMH)."""
    root = display.screen().root
    prop = root.get_full_property(display.intern_atom("_NET_CLIENT_LIST"), Xatom.WINDOW)
    if prop is None:
        return []
    return [display.create_resource_object("window", wid) for wid in prop.value]


class SandboxPage:
    """Reads the mirrored page state from the browser window's title, over X."""

    def __init__(self, display_name: str) -> None:
        self._x = xdisplay.Display(display_name)
        self._name = self._x.intern_atom("_NET_WM_NAME")
        self._utf8 = self._x.intern_atom("UTF8_STRING")
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._x.close()

    def __enter__(self) -> SandboxPage:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def state(self) -> dict[str, Any] | None:
        for window in top_level_clients(self._x):
            wm_class = window.get_wm_class() or ("", "")
            if not wm_class[1].lower().startswith("chromium"):
                continue
            prop = window.get_full_property(self._name, self._utf8)
            if prop is None:
                continue
            title = bytes(prop.value).decode(errors="replace")
            start, end = title.find("{"), title.rfind("}")
            if start < 0 or end < start:
                continue
            try:
                state: dict[str, Any] = json.loads(title[start : end + 1])
            except ValueError:
                continue
            return state
        return None

    def wait(self, predicate: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        """The first state ``predicate`` accepts; the last one seen if none did in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            if state is not None and predicate(state):
                return state
            if time.monotonic() > deadline:
                assert state is not None, "the page never showed its state in the title"
                return state
            time.sleep(0.02)
