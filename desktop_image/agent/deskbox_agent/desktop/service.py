"""The desktop's calls (``act``, ``grab``, ``ready``, ``info``, ``watch``) over one worker
thread (``ready`` and ``watch`` wait for seconds: each on a thread and X connection of its
own).

X work blocks, so it runs on the desktop's one thread, not on the event loop; a lock
keeps the calls one at a time and in the order they came, so batches keep their order.
One exception: a lone quick pointer action (a click) runs on the event loop in its turn,
sending its events and awaiting the X server's reply without blocking. The
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
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ..fdwait import wait_readable
from ..registry import Blob, CallError, Json, Registry
from .errors import DesktopError, DesktopFailed, InvalidAction
from .parts import Parts
from .session_init import StuckBrowser, clues

if TYPE_CHECKING:
    from . import actions as a
    from .desktop import ActionResult, Desktop
    from .encode import EncodedImage
    from .watch import Wake, Watch

__all__ = ["DesktopService", "register_desktop"]

T = TypeVar("T")
MAX_READY_S = 300.0
MAX_WATCH_S = 60.0
# After this long without a desktop call, keycodes lent beyond those that stay lent and
# free memory go back.
IDLE_TRIM_S = 2.0
# The reply to one action that has no result and no screenshot (a click): always the same.
_NO_RESULTS = Parts().blob({"results": [None], "settled": True, "screenshot": None})


class DesktopService:
    """The desktop of one display, driven from one thread."""

    def __init__(self, display_name: str, patience: float = 1.0,
                 init_dir: str | None = None) -> None:
        self.display_name = display_name
        self._patience = patience
        self._init_dir = init_dir  # the session init's files (session_init.py), if any
        self._desktop: Desktop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock: asyncio.Lock | None = None
        self._malloc: _Malloc | None = None
        self._trim: asyncio.TimerHandle | None = None
        self._idle_work: asyncio.Task[None] | None = None  # held: the loop keeps weak refs
        # ``watch``: its own thread, X connection and wake-up pipe, made on its first call.
        self._watch: Watch | None = None
        self._watch_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._watch_wake: Wake | None = None
        self._closed = False

    # -- plumbing ---------------------------------------------------------------------

    def _first_call(self) -> _Malloc:
        if self._malloc is None:
            self._malloc = _Malloc()
        return self._malloc

    async def _on_worker(self, work: Callable[[], T]) -> T:
        malloc = self._first_call()
        if self._lock is None:
            self._lock = asyncio.Lock()
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="desktop")
        if self._trim is not None:
            self._trim.cancel()
        loop = asyncio.get_running_loop()
        lock = self._lock
        try:
            await lock.acquire()
            try:
                running = loop.run_in_executor(self._executor, work)
            except BaseException:
                lock.release()
                raise
            # A call cancelled (the host gave it up) leaves its work running on the worker:
            # it cannot be stopped midway. The desktop stays taken until that work ends, so
            # that a quick pointer action on the loop never runs beside it.
            running.add_done_callback(lambda done: _release(lock, done))
            return await asyncio.shield(running)
        except DesktopError as error:
            raise CallError(error.status, error.kind, error.message, error.action) from None
        finally:
            # Busy, the frame buffers are reused from the heap (no page faults); idle, they
            # go back. On the worker, so that a trim never runs beside a call's X work.
            self._trim = loop.call_later(IDLE_TRIM_S, self._when_idle, malloc)

    async def _pointer_now(
        self, action: a.Action, view: a.View | None, settle: a.SettleOptions | None,
    ) -> Blob | None:
        """One quick pointer action on the event loop, not the worker: its events are well
        under a millisecond of X work, and the two thread hops it saves (each a wake-up,
        under the sandbox's CPU quota) cost more. The reply goes once they are sent: the
        round trip that confirms them is awaited before the next quick action is sent
        (a flood of clicks is held to the X server's pace) and before any other call's
        work, so the X server's turn on a CPU overlaps the reply's way to the client.
        Nothing here blocks: the round trip is awaited on the X connection's readability. It
        takes its turn with the worker's calls (the same lock) and uses the same
        connection. None if the desktop was lost before its turn came."""
        assert self._lock is not None
        if self._trim is not None:
            self._trim.cancel()
        loop = asyncio.get_running_loop()
        try:
            async with self._lock:
                desktop = self._desktop
                if desktop is None:
                    return None
                try:
                    while not desktop.pointer_confirmed():
                        await wait_readable(desktop.x_connection.fileno())
                    desktop.send_pointer(action, view, settle)
                except DesktopFailed:
                    # As _with_desktop: the next call connects afresh (closing may block).
                    self._desktop = None
                    if self._executor is not None:
                        self._executor.submit(desktop.close)
                    raise
            return _NO_RESULTS
        except DesktopError as error:  # the batch's one action failed
            raise CallError(error.status, error.kind, error.message, 0) from None
        finally:
            if self._malloc is not None:
                self._trim = loop.call_later(IDLE_TRIM_S, self._when_idle, self._malloc)

    def _when_idle(self, malloc: _Malloc) -> None:
        """No desktop call for IDLE_TRIM_S: keycodes lent beyond those that stay lent go
        back first, then free memory."""
        desktop = self._desktop
        if desktop is not None and desktop.keyboard.lends_extra and not self._closed:
            # Its turn on the worker ends by setting this timer again: the trim follows.
            self._idle_work = asyncio.get_running_loop().create_task(
                self._give_back_keycodes())
            return
        # On the watch's thread if only watch calls came (a recording of a desktop that
        # a person drives over VNC).
        executor = self._executor or self._watch_executor
        if executor is not None:
            with contextlib.suppress(RuntimeError):  # shut down meanwhile: nothing to trim
                executor.submit(malloc.trim)

    async def _give_back_keycodes(self) -> None:
        """Idle: the keycodes lent beyond those that stay lent go back (keyboard.py), in
        the worker's turn like any call (a few X round trips; it never waits for the
        screen). Its turn ends by setting the idle timer again: if the keys typed on them
        may still be unread, the next idle spell tries again."""
        with contextlib.suppress(CallError):  # the desktop failed: its next call says so
            await self._on_worker(
                lambda: self._with_desktop(lambda desktop: desktop.give_back_keycodes()))

    def _connected(self) -> Desktop:
        """The desktop, connected now if it is not (on the worker thread)."""
        if self._desktop is None:
            from .desktop import Desktop

            self._desktop = Desktop(self.display_name, self._patience)
        return self._desktop

    def _with_desktop(self, work: Callable[[Desktop], T]) -> T:
        desktop = self._connected()
        try:
            desktop.confirm_pointer()
            return work(desktop)
        except DesktopFailed:
            # The X server went away: drop this connection, the next call makes a new one.
            self._desktop = None
            desktop.close()
            raise

    def close(self) -> None:
        """Ends the worker (after the call it runs) and the watch's thread (its wait cut
        short); call from a thread, not the loop."""
        self._closed = True
        if self._trim is not None:
            self._trim.cancel()
        if self._watch_executor is not None:
            assert self._watch_wake is not None
            self._watch_wake.wake()
            self._watch_executor.shutdown(wait=True, cancel_futures=True)
            watch, self._watch = self._watch, None
            if watch is not None:
                watch.close()
            self._watch_wake.close()
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
            raise CallError(error.status, error.kind, error.message, error.action) from None

        if screenshot is None and len(actions) == 1 and self._desktop is not None:
            from .desktop import sends_without_waiting

            if sends_without_waiting(actions[0]):
                done = await self._pointer_now(actions[0], view, settle)
                if done is not None:
                    return done

        def work(desktop: Desktop) -> Blob:
            batch = desktop.run(actions, view, screenshot, settle)
            parts = Parts()
            results = [_result(r, parts) for r in batch.results]
            shot = None if batch.screenshot is None else _image(batch.screenshot, parts)
            return parts.blob({"results": results, "settled": batch.settled,
                               "screenshot": shot})

        return await self._on_worker(lambda: self._with_desktop(work))

    async def tap_keysym(self, args: Mapping[str, Json]) -> Json:
        """A live viewer's key that types a character off the layout, typed here."""
        from .keys import off_layout_char

        _only(args, ("keysym",))
        keysym = args.get("keysym")
        if type(keysym) is not int or not off_layout_char(keysym):
            raise CallError(422, "invalid_action",
                            "keysym must be the keysym of a character a US layout lacks")
        await self._on_worker(lambda: self._with_desktop(lambda d: d.tap_keysym(keysym)))
        return {}

    async def grab(self, args: Mapping[str, Json]) -> Blob:
        _only(args, ())
        return await self._on_worker(lambda: self._with_desktop(lambda d: _grab(d, False)))

    async def grab_deflated(self, args: Mapping[str, Json]) -> Blob:
        _only(args, ())
        return await self._on_worker(lambda: self._with_desktop(lambda d: _grab(d, True)))

    async def mark(self, args: Mapping[str, Json]) -> Json:
        _only(args, ())
        malloc = self._first_call()

        def work(desktop: Desktop) -> Json:
            desktop.mark()
            # The host checkpoints the sandbox next: free memory kept for the next
            # screenshots would be dumped and restored with it.
            malloc.trim()
            return {}

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
        init = self._init_dir
        stuck = StuckBrowser(init).check if init else lambda: None
        # Its own thread and X connection: waiting for a browser must not hold the desktop's.
        try:
            timings = await asyncio.to_thread(
                wait_ready, self.display_name, browser, float(timeout_s),  # type: ignore[arg-type]
                stuck)
        except DesktopError as error:
            processes = ("wm", "browser") if browser else ("wm",)
            why = clues(init, *processes) if init else ""
            raise CallError(error.status, error.kind, error.message + why) from None
        # The desktop's own connections (input, capture: libraries found, shared memory
        # set up) are made now, while the sandbox is young: a session that later runs into
        # its pids limit (a fork bomb) can still be driven.
        await self._on_worker(lambda: self._with_desktop(lambda desktop: None))
        return dict(timings)

    async def watch(self, args: Mapping[str, Json]) -> Blob:
        timeout_s, quality, now = _watch_args(args)
        if self._closed:
            raise CallError(503, "desktop_failed", "the desktop has been stopped")
        from .watch import Wake

        malloc = self._first_call()
        if self._watch_executor is None:
            self._watch_wake = Wake()
            self._watch_executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="desktop-watch")
        wake = self._watch_wake
        assert wake is not None
        gone = threading.Event()

        def stopped() -> bool:
            return gone.is_set() or self._closed

        def work() -> Blob:
            image = self._watched(timeout_s, quality, now, wake, stopped)
            parts = Parts()
            return parts.blob({"changed": image is not None,
                               "image": None if image is None else _image(image, parts)})

        loop = asyncio.get_running_loop()
        if self._trim is not None:
            self._trim.cancel()  # a recording is busy: its frame buffers stay for the next
        try:
            return await loop.run_in_executor(self._watch_executor, work)
        except asyncio.CancelledError:
            # The host gave the call up: its wait ends now, not at its timeout, so that
            # the next watch does not queue behind it.
            gone.set()
            wake.wake()
            raise
        except DesktopError as error:
            raise CallError(error.status, error.kind, error.message, error.action) from None
        finally:
            self._trim = loop.call_later(IDLE_TRIM_S, self._when_idle, malloc)

    def _watched(self, timeout_s: float, quality: int, now: bool, wake: Wake,
                 stopped: Callable[[], bool]) -> EncodedImage | None:
        """The next frame, on the watch's thread; connects first if not connected."""
        if self._watch is None:
            from .watch import Watch

            self._watch = Watch(self.display_name)
        watch = self._watch
        try:
            return watch.next_frame(timeout_s, quality, now, wake, stopped)
        except DesktopFailed:
            # As _with_desktop: the next call connects afresh.
            self._watch = None
            watch.close()
            raise


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_KEEP_WHILE_BUSY = 64 * 1024 * 1024
_HEAP_UP_TO = 32 * 1024 * 1024  # glibc's ceiling for the mmap threshold (64-bit)


class _Malloc:
    """What glibc keeps of the desktop's memory: little while idle, quick while busy.

    A screenshot allocates several frame-sized buffers (4 MB at 1280x800). Handed out
    again from the heap they are fast; fresh pages from the kernel cost 1.5-3.5 ms of page
    faults per screenshot. glibc's own thresholds move: after the first 4 MB buffer it
    gives the heap's top back once 8 MB of it are free, which a PNG of a page of text
    reaches (the capture, the rows, the deflated bytes): every such screenshot then faulted
    its buffers in anew (9.8 → 6.2 ms). So: buffers up to 32 MB always come from the heap,
    free memory stays there while busy (up to 64 MB), one arena serves all threads (the
    desktop's worker, ``ready``'s, which take turns, and the encode's helpers, which hold
    a strip's buffers for a millisecond or two), and ``trim`` (on the worker, once the
    desktop has been idle for a moment, and at a ``mark``, before the host checkpoints the
    sandbox) gives the free pages back. Not glibc: nothing to tune.
    """

    def __init__(self) -> None:
        import ctypes

        try:
            self._libc: ctypes.CDLL | None = ctypes.CDLL(None)
            self._libc.mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(1))
            self._libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(_HEAP_UP_TO))
            self._libc.mallopt(ctypes.c_int(_M_TRIM_THRESHOLD), ctypes.c_int(_KEEP_WHILE_BUSY))
        except (OSError, AttributeError):
            self._libc = None

    def trim(self) -> None:
        if self._libc is not None:
            with contextlib.suppress(AttributeError):
                self._libc.malloc_trim(0)


def _only(args: Mapping[str, Json], allowed: tuple[str, ...]) -> None:
    unknown = sorted(k for k in args if k not in allowed)
    if unknown:
        raise CallError(422, "invalid_action", f"unknown field {unknown[0][:64]!r}")


def _watch_args(args: Mapping[str, Json]) -> tuple[float, int, bool]:
    _only(args, ("timeout_s", "quality", "now"))
    timeout_s = args.get("timeout_s", 10.0)
    quality = args.get("quality", 60)
    now = args.get("now", False)
    if not (isinstance(timeout_s, int | float) and type(timeout_s) is not bool
            and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_WATCH_S):
        raise CallError(422, "invalid_action", f"timeout_s must be in (0, {MAX_WATCH_S}]")
    if type(quality) is not int or not 1 <= quality <= 100:
        raise CallError(422, "invalid_action", "quality must be an integer in [1, 100]")
    if type(now) is not bool:
        raise CallError(422, "invalid_action", "now must be true or false")
    return float(timeout_s), quality, now


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


def _grab(desktop: Desktop, deflate: bool) -> Blob:
    import numpy as np

    frame = desktop.grab_screen()
    pixels = np.ascontiguousarray(frame.pixels)
    header: dict[str, Json] = {"width": frame.width, "height": frame.height,
                               "pixel_format": "bgrx"}
    if deflate:
        # A screen deflates ~100x in 1-2 ms (in strips on the sandbox's CPUs), where its
        # raw 4 MB took the stream ~20 ms.
        from .encode import deflate_frame

        data = deflate_frame(pixels, desktop.strips)
        header["encoding"] = "deflate"
    else:
        data = pixels.tobytes()
    parts = Parts()
    header["pixels"] = parts.add(data)
    return parts.blob(header)


def register_desktop(
    registry: Registry, display_name: str, patience: float = 1.0, init_dir: str | None = None
) -> DesktopService:
    """Register the desktop's calls for ``display_name``; nothing connects until a call.
    ``patience``: see :class:`Desktop`; ``init_dir``: the session init's files, which
    ``ready`` reads (desktop/session_init.py)."""
    service = DesktopService(display_name, patience, init_dir)
    registry.register("act", service.act)
    registry.register("grab", service.grab)
    registry.register("tap_keysym", service.tap_keysym)
    registry.register("grab_deflated", service.grab_deflated)
    registry.register("ready", service.ready)
    registry.register("info", service.info)
    registry.register("mark", service.mark)
    registry.register("watch", service.watch)
    return service


def _release(lock: asyncio.Lock, done: asyncio.Future[Any]) -> None:
    """The worker's work ended: the desktop is free. Its error, if the call that waited
    for it was cancelled, is nobody's to hear (read here, so that asyncio logs nothing)."""
    lock.release()
    if not done.cancelled():
        done.exception()
