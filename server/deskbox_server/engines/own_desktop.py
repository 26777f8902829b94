"""A sandbox whose desktop is the session image's own, alone in its kernel or namespaces: a
VM guest, a docker container. Unlike a runc sandbox, which shares the host's display
numbers, it has one X display (``:99``), its sockets in ``/tmp/.X11-unix``, the browser's
DevTools on its own loopback and ``/root`` as home.
"""

from __future__ import annotations

import re

from ..errors import InvalidRequest
from .base import Sandbox
from .desktop_commands import DEVTOOLS_PORT

__all__ = ["OWN_DISPLAY", "OWN_HOME", "OWN_SOCKET_DIR", "OwnDesktopSandbox"]

OWN_DISPLAY = 99
OWN_HOME = "/root"
OWN_SOCKET_DIR = "/tmp/.X11-unix"
# Session ids become parts of names and paths on the host: container, VM and pod names.
_SESSION_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class OwnDesktopSandbox(Sandbox):
    def __init__(self, max_execs: int, session_id: str, kind: str) -> None:
        """``kind``: what the sandbox is, in the refusal of an unusable id ("a VM")."""
        if not _SESSION_ID.match(session_id):
            raise InvalidRequest(f"session id {session_id!r} is not usable for {kind}")
        self._max_execs = max_execs
        self.session_id = session_id

    @property
    def agent_display(self) -> str:
        return f":{OWN_DISPLAY}"

    @property
    def vnc_socket_dir(self) -> str:
        return OWN_SOCKET_DIR

    @property
    def devtools_port(self) -> int:
        return DEVTOOLS_PORT

    @property
    def max_execs(self) -> int:
        return self._max_execs

    def exec_environment(self) -> tuple[dict[str, str], str]:
        """What the sandbox's init gives its children (deskbox-session), and ``DISPLAY``:
        commands run as the desktop's own processes do."""
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": OWN_HOME,
            "LANG": "C.UTF-8",
            "DISPLAY": self.agent_display,
        }, OWN_HOME
