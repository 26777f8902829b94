"""The event page for sandboxed sessions, and how a test reads what it received.

A sandbox sees no host path and has no network, so the page goes in as a ``data:`` URL.
The page mirrors what a test needs (clicks, the text field's value) into
``document.title``; Chromium puts the title into its window's ``_NET_WM_NAME``, which a
small python-xlib script reads inside the sandbox, run by the session's exec API (through
its agent): the test process itself speaks no X11 to a sandbox.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx

from deskbox_server.engines.runc.sandbox import RuncOptions

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
    found = list(RuncOptions.shared_root.glob(f"*-{session_dir.name}/display/number"))
    assert len(found) == 1, found
    return int(found[0].read_text())


# Inside the sandbox: the agent's own wheels (python-xlib) are in /usr/lib/deskbox-agent.
_READ_TITLE = """
import sys
from Xlib import Xatom, display
x = display.Display()
root = x.screen().root
listed = root.get_full_property(x.intern_atom("_NET_CLIENT_LIST"), Xatom.WINDOW)
for wid in listed.value if listed is not None else []:
    window = x.create_resource_object("window", wid)
    if not (window.get_wm_class() or ("", ""))[1].lower().startswith("chromium"):
        continue
    name = window.get_full_property(x.intern_atom("_NET_WM_NAME"), x.intern_atom("UTF8_STRING"))
    if name is not None:
        sys.stdout.write(bytes(name.value).decode(errors="replace") + "\\n")
"""


class SandboxPage:
    """Reads the mirrored page state from the browser window's title, inside the sandbox."""

    def __init__(self, client: httpx.Client, session_id: str, exec_timeout_s: float = 30.0
                 ) -> None:
        """``exec_timeout_s``: of each read (a Python program in the sandbox; under a VM's
        software emulation it may take tens of seconds)."""
        self._client = client
        self._session_id = session_id
        self._exec_timeout_s = exec_timeout_s

    def close(self) -> None:
        return None  # nothing held between reads: a checkpoint may come at any time

    def __enter__(self) -> SandboxPage:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def state(self) -> dict[str, Any] | None:
        response = self._client.post(f"/v1/sessions/{self._session_id}/exec", json={
            "cmd": ["python3", "-c", _READ_TITLE],
            "env": {"PYTHONPATH": "/usr/lib/deskbox-agent"}, "timeout_s": self._exec_timeout_s,
        })
        assert response.status_code == 200, response.text
        result = response.json()
        assert result["exit_code"] == 0, result
        for title in str(result["stdout"]).splitlines():
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
