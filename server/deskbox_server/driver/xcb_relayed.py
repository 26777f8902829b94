"""mss's XCB backends, connected to a sandbox's X server through an ``XRelay``.

mss connects libxcb by display name; ours is connected to the relay's socketpair with
``xcb_connect_to_fd``. ``RelayedXcb.__init__`` takes the place of mss's XCB base
constructor and makes the same checks of the screen format (what mss's capture paths rely
on), plus one of its own: the screen is the size the session's other connection reported,
so that size bounds the shared buffer and every reply.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from ctypes import CFUNCTYPE, POINTER, c_int, c_void_p
from typing import Any

from mss.base import MSSImplementation
from mss.exception import ScreenShotError
from mss.linux import xcb, xcbgen
from mss.linux.base import (
    SUPPORTED_BITS_PER_PIXEL,
    SUPPORTED_BLUE_MASK,
    SUPPORTED_DEPTHS,
    SUPPORTED_GREEN_MASK,
    SUPPORTED_RED_MASK,
    MSSImplXCBBase,
)
from mss.linux.xcbhelpers import LIB, Connection

from ..errors import DesktopFailed
from .xlimits import reply_limit
from .xrelay import XRelay

__all__ = ["RelayedXcb"]


class RelayedXcb(MSSImplXCBBase):
    """An mss backend's xcb connection through an :class:`XRelay`. A subclass that also
    derives from an mss backend calls :meth:`_init_relayed` from its ``__init__``."""

    _relay_to: tuple[str, int, int]

    def _init_relayed(
        self, display_name: str, width: int, height: int, init: Callable[[], None]
    ) -> None:
        """Run the mss backend's ``init`` over a relay to ``display_name``, whose screen
        must be ``width`` x ``height``; a failure closes the relay and says why."""
        self._relay_to = (display_name, width, height)
        try:
            init()
        except Exception as error:
            if hasattr(self, "relay"):
                RelayedXcb.close(self)
                raise self.failure_of(error) from None
            raise

    def __init__(self, *, display: Any = None, with_cursor: bool = False) -> None:
        MSSImplementation.__init__(self, with_cursor=with_cursor)
        name, width, height = self._relay_to
        self.relay = XRelay(name, reply_limit(width, height))
        self.conn = None
        self._connect(name)
        self._check_screen(width, height)

    def _connect(self, name: str) -> None:
        xcb.initialize()
        connect_to_fd = CFUNCTYPE(POINTER(Connection), c_int, c_void_p)(
            ("xcb_connect_to_fd", LIB.xcb)
        )
        conn_p = connect_to_fd(self.relay.client_fd(), None)
        if LIB.xcb.xcb_connection_has_error(conn_p):
            LIB.xcb.xcb_disconnect(conn_p)
            reason = self.relay.failure or "the X server refused the connection"
            raise DesktopFailed(f"cannot connect to X display {name} for capture: {reason}")
        self.conn = conn_p.contents
        self._xfixes_ready = None

    def _check_screen(self, width: int, height: int) -> None:
        assert self.conn is not None
        setup = xcb.get_setup(self.conn)
        self.pref_screen = screen = xcbgen.setup_roots(setup)[0]
        self.root = self.drawable = screen.root
        self.drawable_depth = screen.root_depth
        self.drawable_visual_id = screen.root_visual
        size = (screen.width_in_pixels, screen.height_in_pixels)
        if size != (width, height):
            _unsupported(f"{size[0]}x{size[1]}, not {width}x{height}")
        if setup.image_byte_order != xcbgen.ImageOrder.LSBFirst:
            _unsupported("images are not LSB first")
        if self.drawable_depth not in SUPPORTED_DEPTHS:
            _unsupported(f"depth {self.drawable_depth}")
        formats = [f for f in xcbgen.setup_pixmap_formats(setup) if f.depth == self.drawable_depth]
        if not formats or (formats[0].bits_per_pixel, formats[0].scanline_pad) != (
            SUPPORTED_BITS_PER_PIXEL, SUPPORTED_BITS_PER_PIXEL
        ):
            _unsupported("pixels are not 32 bits unpadded")
        visuals = [
            v
            for d in xcbgen.screen_allowed_depths(screen)
            if d.depth == self.drawable_depth
            for v in xcbgen.depth_visuals(d)
            if v.visual_id == self.drawable_visual_id
        ]
        if not visuals or (
            visuals[0].class_ not in (xcbgen.VisualClass.TrueColor, xcbgen.VisualClass.DirectColor)
            or (visuals[0].red_mask, visuals[0].green_mask, visuals[0].blue_mask)
            != (SUPPORTED_RED_MASK, SUPPORTED_GREEN_MASK, SUPPORTED_BLUE_MASK)
        ):
            _unsupported("the root visual is not BGRx true colour")

    def failure_of(self, error: Exception) -> Exception:
        """What to raise for ``error`` from mss: ``DesktopFailed`` if the connection is lost."""
        if isinstance(error, DesktopFailed):
            return error
        if self.relay.failure is not None:
            return DesktopFailed(f"the desktop failed: {self.relay.failure}")
        if isinstance(error, ScreenShotError):
            return DesktopFailed(f"the desktop failed: lost the capture connection: {error}")
        return error

    def close(self) -> None:
        try:
            with suppress(ScreenShotError):  # mss reports a connection that had broken
                super().close()
        finally:
            self.conn = None  # xcb_disconnect has freed it, whatever mss raised
            self.relay.close()


def _unsupported(what: str) -> None:
    raise DesktopFailed(f"the X server's screen cannot be captured: {what}")
