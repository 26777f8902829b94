"""The desktop's calls (``act``, ``grab``, ``ready``, ``info``) over one worker thread.

X work blocks, so it runs on the desktop's one thread, never on the event loop; a lock
keeps the calls one at a time and in the order they came, so batches keep their order. The
X connection is made on the first call and made again after the X server went away (a
call that lost it fails with ``desktop_failed``; the next one connects afresh). The heavy
modules (python-xlib, numpy, mss, the encoders) are imported on that first call too: an
agent nobody asks to drive a desktop never loads them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from ..registry import Blob, CallError, Json, Registry
from .errors import DesktopError, DesktopFailed, InvalidAction

if TYPE_CHECKING:
    from .desktop import ActionResult, Desktop
    from .encode import EncodedImage
    from .parts import Parts

__all__ = ["DesktopService", "register_desktop"]

T = TypeVar("T")
MAX_READY_S = 300.0


class DesktopService:
    """The desktop of one display, driven from one thread."""

    def __init__(self, display_name: str) -> None:
        self.display_name = display_name
        self._desktop: Desktop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock: asyncio.Lock | None = None
        self._malloc_tuned = False

    # -- plumbing ---------------------------------------------------------------------

    def _first_call(self) -> None:
        if not self._malloc_tuned:
            _tune_malloc()
            self._malloc_tuned = True

    async def _on_worker(self, work: Callable[[], T]) -> T:
        self._first_call()
        if self._lock is None:
            self._lock = asyncio.Lock()
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="desktop")
        async with self._lock:
            loop = asyncio.get_running_loop()
            try:
                return await loop.run_in_executor(self._executor, work)
            except DesktopError as error:
                raise CallError(error.status, error.kind, error.message) from None

    def _connected(self) -> Desktop:
        """The desktop, connected now if it is not (on the worker thread)."""
        if self._desktop is None:
            from .desktop import Desktop

            self._desktop = Desktop(self.display_name)
        return self._desktop

    def _with_desktop(self, work: Callable[[Desktop], T]) -> T:
        desktop = self._connected()
        try:
            return work(desktop)
        except DesktopFailed:
            # The X server went away: drop this connection, the next call makes a new one.
            self._desktop = None
            desktop.close()
            raise

    def close(self) -> None:
        if self._executor is not None:
            desktop, self._desktop = self._desktop, None
            if desktop is not None:
                self._executor.submit(desktop.close)
            self._executor.shutdown(wait=True)

    # -- the calls ----------------------------------------------------------------------

    async def act(self, args: Mapping[str, Json]) -> Blob:
        from . import actions as a

        _only(args, ("actions", "view", "screenshot", "settle"))
        try:
            actions = a.parse_actions(args.get("actions", []))
            view = a.parse_view(args.get("view"))
            screenshot = a.parse_screenshot(args.get("screenshot"))
            settle = a.parse_settle(args.get("settle"))
        except InvalidAction as error:
            raise CallError(error.status, error.kind, error.message) from None

        def work(desktop: Desktop) -> Blob:
            from .parts import Parts

            batch = desktop.run(actions, view, screenshot, settle)
            parts = Parts()
            results = [_result(r, parts) for r in batch.results]
            shot = None if batch.screenshot is None else _image(batch.screenshot, parts)
            return parts.blob({"results": results, "settled": batch.settled,
                               "screenshot": shot})

        return await self._on_worker(lambda: self._with_desktop(work))

    async def grab(self, args: Mapping[str, Json]) -> Blob:
        _only(args, ())

        def work(desktop: Desktop) -> Blob:
            import numpy as np

            from .parts import Parts

            frame = desktop.grab_screen()
            parts = Parts()
            place = parts.add(np.ascontiguousarray(frame.pixels).tobytes())
            return parts.blob({"width": frame.width, "height": frame.height,
                               "pixel_format": "bgrx", "pixels": place})

        return await self._on_worker(lambda: self._with_desktop(work))

    async def info(self, args: Mapping[str, Json]) -> Json:
        _only(args, ())

        def work(desktop: Desktop) -> Json:
            return {"display": self.display_name, "width": desktop.width,
                    "height": desktop.height, "capture": desktop.capture_method}

        return await self._on_worker(lambda: self._with_desktop(work))

    async def ready(self, args: Mapping[str, Json]) -> Json:
        _only(args, ("browser", "timeout_s"))
        browser = args.get("browser", False)
        timeout_s = args.get("timeout_s", 30.0)
        if type(browser) is not bool:
            raise CallError(422, "invalid_action", "browser must be true or false")
        if (type(timeout_s) not in (int, float) or not math.isfinite(timeout_s)  # type: ignore[arg-type]
                or not 0 < timeout_s <= MAX_READY_S):  # type: ignore[operator]
            raise CallError(422, "invalid_action", f"timeout_s must be in (0, {MAX_READY_S}]")
        from .ready import wait_ready

        self._first_call()
        # Its own thread and X connection: waiting for a browser must not hold the desktop's.
        try:
            timings = await asyncio.to_thread(
                wait_ready, self.display_name, browser, float(timeout_s))  # type: ignore[arg-type]
        except DesktopError as error:
            raise CallError(error.status, error.kind, error.message) from None
        return dict(timings)


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameters (malloc.h)
_M_ARENA_MAX = -8


def _tune_malloc() -> None:
    """Keep what glibc holds on to small: the desktop's buffers are large and short-lived.

    A screenshot allocates several frame-sized buffers (4 MB at 1280x800). With glibc's
    defaults the mmap threshold grows after the first such buffer is freed, so later ones
    are carved from (and kept in) an arena, and every thread that allocates (the desktop's
    worker, ``ready``'s) gets an arena of its own: 30 MiB of PSS an idle session would
    carry for good. A fixed 128 KiB threshold gives every large buffer back when it is
    freed; one arena is enough for threads that take turns.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to tune
        libc = ctypes.CDLL(None)
        libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(128 * 1024))
        libc.mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(1))


def _only(args: Mapping[str, Json], allowed: tuple[str, ...]) -> None:
    unknown = sorted(k for k in args if k not in allowed)
    if unknown:
        raise CallError(422, "invalid_action", f"unknown field {unknown[0][:64]!r}")


def _image(image: EncodedImage, parts: Parts) -> dict[str, Json]:
    return {"type": "image", "media_type": image.media_type, "width": image.width,
            "height": image.height, **parts.add(image.data)}


def _result(result: ActionResult, parts: Parts) -> Json:
    from .desktop import ClipboardText, Point, Size
    from .encode import EncodedImage

    match result:
        case None:
            return None
        case Point(x=x, y=y):
            return {"type": "point", "x": x, "y": y}
        case Size(width=width, height=height):
            return {"type": "size", "width": width, "height": height}
        case ClipboardText(text=text):
            return {"type": "clipboard", **parts.add(text.encode())}
        case EncodedImage():
            return _image(result, parts)
    raise AssertionError(f"no wire form for {result!r}")


def register_desktop(registry: Registry, display_name: str) -> DesktopService:
    """Register the desktop's calls for ``display_name``; nothing connects until a call."""
    service = DesktopService(display_name)
    registry.register("act", service.act)
    registry.register("grab", service.grab)
    registry.register("ready", service.ready)
    registry.register("info", service.info)
    return service
