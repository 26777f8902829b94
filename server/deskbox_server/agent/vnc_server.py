"""A session's VNC server: x11vnc on the session's display, on a unix socket only.

x11vnc gets ``-rfbport 0 -rfbportv6 -1``: it opens no TCP port at all (without the
second, libvncserver still listens on ``[::]:5900``), and ``-unixsock`` puts its socket in
a directory of the desktop's. The desktop's agent starts it and is the only one asked to
connect to that socket (agent_vnc.py); the control plane's proxy (vnc/proxy.py) gets each
connection as an agent channel.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

__all__ = ["START_TIMEOUT_S", "VncServer", "x11vnc_argv"]

START_TIMEOUT_S = 15.0


def x11vnc_argv(display: str, socket_path: str) -> list[str]:
    """x11vnc serving ``display`` on the unix socket ``socket_path`` and nothing else."""
    return [
        "x11vnc", "-display", display,
        "-unixsock", socket_path, "-rfbport", "0", "-rfbportv6", "-1", "-noipv6",
        "-shared", "-forever", "-nopw",  # many viewers; the proxy does authentication
        "-nolookup", "-nocmds", "-noremote", "-nossl", "-q",
        "-noxrecord",  # XRECORD's polling is not needed with XDAMAGE on Xvfb
        "-nonap",  # no longer naps between screen polls when the screen is idle
        # x11vnc creates its selection window (and starts XFIXES) only ~8-45 s after the
        # first viewer came, "to get past a display manager": until then a viewer's paste
        # cannot own CLIPBOARD/PRIMARY and the selections are not polled. No DM here.
        "-env", "X11VNC_AVOID_WINDOWS=never",
    ]


class VncServer(ABC):
    """One running VNC server; connect as often as needed, then ``stop`` it."""

    @abstractmethod
    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new RFB connection to the server (before its ProtocolVersion)."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the server is gone, or None while it runs."""

    @abstractmethod
    async def stop(self) -> None:
        """End the server and remove its socket; idempotent."""
