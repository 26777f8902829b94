"""Screen capture with mss: XShmGetImage on the agent's own X server, GetImage as fallback.

Inside the sandbox the X server is the session's own, so the shared memory segment is an
ordinary one (no sealed memfd, no bounded relay: those guard the host, which no longer
talks X11 to a sandbox).
"""

from __future__ import annotations

import numpy as np
from Xlib.display import Display
from Xlib.error import XError

from .errors import DesktopFailed
from .frame import Frame
from .xlibs import sonames_known

with sonames_known():  # mss names its libraries on import and when its xcb bindings load
    from mss.linux import xcb
    from mss.linux.xshmgetimage import MSSImplXShmGetImage

    xcb.initialize()

__all__ = ["Capturer"]


class Capturer:
    """Grabs the screen of one display; call only from the desktop's worker thread."""

    def __init__(self, display_name: str, xlib_display: Display) -> None:
        self._mss = MSSImplXShmGetImage(display=display_name)
        self._xlib = xlib_display
        self._root = xlib_display.screen().root
        # mss sets up the shared segment on its first grab: done now, while the desktop
        # connects, so that a failure shows at the start, not at a later screenshot.
        self.grab(0, 0, 1, 1)

    @property
    def method(self) -> str:
        status = " ".join(self._mss.performance_status)
        if "MIT-SHM is working" in status:
            return "xshm"
        return "getimage" if status else "xshm (not used yet)"

    def grab(self, x: int, y: int, width: int, height: int, cursor: bool = False) -> Frame:
        try:
            raw = self._mss.grab({"left": x, "top": y, "width": width, "height": height})
        except Exception as error:  # noqa: BLE001 (mss raises its own ScreenShotError and xcb's)
            raise DesktopFailed(f"the desktop failed: cannot capture the screen: {error}") from None
        if len(raw) != width * height * 4:
            raise DesktopFailed(f"the X server sent a {len(raw)}-byte image for {width}x{height}")
        pixels = np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 4)
        if cursor:
            pixels = pixels.copy()
            self._draw_cursor(pixels, x, y)
        return Frame(pixels)

    def _draw_cursor(self, pixels: np.ndarray, origin_x: int, origin_y: int) -> None:
        """Blend the current cursor image (XFixes, premultiplied ARGB) into the frame."""
        try:
            reply = self._xlib.xfixes_get_cursor_image(self._root)
        except XError:
            return
        cw, ch = int(reply.width), int(reply.height)
        if not cw or not ch:
            return
        argb = np.array(reply.cursor_image, dtype=np.uint32).reshape(ch, cw)
        left = int(reply.x) - int(reply.xhot) - origin_x
        top = int(reply.y) - int(reply.yhot) - origin_y
        fh, fw = pixels.shape[:2]
        x0, y0 = max(left, 0), max(top, 0)
        x1, y1 = min(left + cw, fw), min(top + ch, fh)
        if x0 >= x1 or y0 >= y1:
            return
        sprite = argb[y0 - top : y1 - top, x0 - left : x1 - left]
        alpha = ((sprite >> 24) & 0xFF).astype(np.uint16)[..., None]
        colour = np.stack(
            [(sprite & 0xFF), (sprite >> 8) & 0xFF, (sprite >> 16) & 0xFF], axis=-1
        ).astype(np.uint16)
        under = pixels[y0:y1, x0:x1, :3].astype(np.uint16)
        blended = colour + (under * (255 - alpha) + 127) // 255
        pixels[y0:y1, x0:x1, :3] = np.minimum(blended, 255).astype(np.uint8)

    def close(self) -> None:
        self._mss.close()
