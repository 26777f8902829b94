"""The desktop the agent drives: its own X display (XTEST input, capture and encoding,
settling, clipboard, keymaps) behind the calls ``act``, ``grab``, ``ready``, ``info`` and
``watch``.

Inside the sandbox the X server is the session's own, so this is plain python-xlib and
mss: the host, which treats the whole sandbox as hostile, never speaks X11 to it.
Importing this package loads none of the X or imaging modules: the service imports them
on the first desktop call.
"""

from __future__ import annotations

from .service import DesktopService, register_desktop

__all__ = ["DesktopService", "register_desktop"]
