"""One connected desktop: executes actions and captures the screen of the agent's display.

A ``Desktop`` holds the X connections of one display and is not thread-safe: the service
(``service.py``) creates and uses it on the desktop's one worker thread, one call at a
time; only ``send_pointer`` and ``pointer_confirmed`` (which never wait on the X server)
are called from the event loop, in their turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
from isal import isal_zlib
from Xlib import X
from Xlib import display as xdisplay
from Xlib.error import ConnectionClosedError, DisplayError, XError
from Xlib.protocol.rq import Event

from . import actions as a
from .capture import Capturer
from .clipboard import Clipboard
from .cpu_waits import CpuWaits
from .encode import EncodedImage, encode
from .errors import DesktopError, DesktopFailed, InvalidAction
from .frame import Frame
from .keyboard import Keyboard
from .keymap_watch import KeymapWatch
from .pointer import PendingSync, Pointer
from .settle import SettleWatcher
from .space import Space
from .strips import Strips

__all__ = [
    "ActionResult", "BatchResult", "ClipboardText", "Desktop", "Point", "Size",
    "sends_without_waiting",
]

_BUTTON_ACTIONS = (a.Click, a.MouseDown, a.MouseUp, a.Drag)
_KEYBOARD_ACTIONS = (a.TypeText, a.Key, a.HoldKey)
# Actions that change nothing on the screen: after a batch of only these, quiet time from
# before the batch counts towards settling (an agent's "observe" is then not held 100 ms).
_LOOKING_ACTIONS = (a.Wait, a.Screenshot, a.Zoom, a.CursorPosition, a.ScreenSize,
                    a.ClipboardGet)
_BUTTON_RECENT_S = 1.0  # a key later than this after a click is not racing it
_BUTTON_LAND_MAX_S = 0.5
# A screen that keeps changing after a click (a spinner, a video) never gives the quiet that
# the next keys or click wait for: they give up this much after the quiet's own length.
_BUTTON_BUSY_S = 0.12
X_ERRORS = (ConnectionClosedError, XError, OSError)
_MAX_QUICK_NOTCHES = 20
# The last look is kept for reuse only up to this size: a 1280x800 page is 30-300 KiB as
# JPEG, a photo 2 MiB as PNG, but a look scaled up to 7680x4320 would hold tens of MiB in
# an idle session (and its checkpoints).
REUSE_MAX_BYTES = 4 * 1024 * 1024
# A batch's reply is built whole in the agent's memory (and the sandbox's): a thousand
# looks of a photo-like page scaled up would take gigabytes and the agent with them.
MAX_BATCH_REPLY_BYTES = 256 * 1024 * 1024


def sends_without_waiting(action: a.Action) -> bool:
    """True for a pointer action whose events go out in one go, with no wait between
    them and none after but the X server's round trip: a single click or a move without
    modifiers, a button going down or up, a few wheel notches. (Modifiers may have to
    borrow a keycode and wait for clients to re-read the mapping; a double click waits
    between its clicks.)"""
    match action:
        case a.Click(count=1, modifiers=()) | a.Move(modifiers=()):
            return True
        case a.MouseDown() | a.MouseUp():
            return True
        case a.Scroll(modifiers=()):
            return abs(action.dx) + abs(action.dy) <= _MAX_QUICK_NOTCHES
    return False


@dataclass(frozen=True)
class Point:
    x: int
    y: int


@dataclass(frozen=True)
class Size:
    width: int
    height: int


@dataclass(frozen=True)
class ClipboardText:
    text: str


ActionResult = EncodedImage | Point | Size | ClipboardText | None


def _reply_bytes(result: ActionResult) -> int:
    if isinstance(result, EncodedImage):
        return len(result.data)
    if isinstance(result, ClipboardText):
        return len(result.text.encode(errors="surrogatepass"))
    return 0


@dataclass(frozen=True)
class _Shot:
    """A screenshot as sent, with what it showed and how it was asked for."""

    key: tuple[object, ...]
    changes: int  # the settle watcher's count of screen changes before its capture
    image: EncodedImage


@dataclass(frozen=True)
class BatchResult:
    results: list[ActionResult]
    screenshot: EncodedImage | None
    settled: bool


class Desktop:
    def __init__(self, display_name: str, patience: float = 1.0) -> None:
        """``patience`` multiplies the bounds on waiting for other clients (Chromium
        re-reading the keymap, drawing typed keys): a guest under software emulation runs
        them many times slower, and keys typed before the wait ends come out empty."""
        self.display_name = display_name
        self._patience = patience
        try:
            self._x = xdisplay.Display(display_name)
        except (DisplayError, ConnectionClosedError, ConnectionError, OSError) as error:
            raise DesktopFailed(f"cannot connect to X display {display_name}: {error}") from None
        try:
            self._x.xfixes_query_version()
            screen = self._x.screen()
            self.width: int = screen.width_in_pixels
            self.height: int = screen.height_in_pixels
            self.pointer = Pointer(self._x)
            self.settle_options = a.SettleOptions()
            self._settle = SettleWatcher(self._x, self._on_event, CpuWaits(self._x))
            self._keymap_watch = self._watch_keymap_reads()
            self.keyboard = Keyboard(self._x, self._typing_shown, self._keymap_reread)
            self._capturer = Capturer(display_name, self._x)
        except BaseException as error:
            # Nothing of a desktop that failed to come up is left behind (connections, threads).
            watch: KeymapWatch | None = getattr(self, "_keymap_watch", None)
            if watch is not None:
                watch.close()
            with suppress(Exception):
                self._x.close()
            if isinstance(error, X_ERRORS):
                raise DesktopFailed(f"the X display {display_name} failed: {error}") from None
            raise
        self._closed = False
        self._last_button_at = 0.0
        # The round trip behind the last ``send_pointer``, until its reply is read.
        self._unconfirmed: PendingSync | None = None
        # The checksum of the screen as the host's last ``mark`` found it (before a
        # checkpoint), until an action or a look at other pixels.
        self._marked: int | None = None
        self._last_shot: _Shot | None = None
        self.screenshots_reused = 0
        # A look's encode on the CPUs the sandbox may use (the helper threads start with
        # the first frame big enough to cut).
        self.strips = Strips()
        self.clipboard = Clipboard(display_name)  # its own X connections, made when used

    @property
    def x_connection(self) -> xdisplay.Display:
        return self._x

    @property
    def capture_method(self) -> str:
        return self._capturer.method

    def _on_event(self, event: Event) -> None:
        if event.type == X.MappingNotify:
            self.keyboard.mapping_changed()

    def space(self, view: a.View | None) -> Space:
        if view is None:
            return Space(self.width, self.height, self.width, self.height)
        return Space(self.width, self.height, view.width, view.height)

    # -- running actions ------------------------------------------------------------------

    def run(
        self,
        actions: Sequence[a.Action],
        view: a.View | None = None,
        screenshot: a.Screenshot | None = None,
        settle: a.SettleOptions | None = None,
    ) -> BatchResult:
        """Run ``actions`` in order; then, if asked, a screenshot once the screen has settled."""
        self._check_alive()
        if settle is not None:
            self.settle_options = settle
        space = self.space(view)
        self._settle.new_batch()
        looking = all(isinstance(action, _LOOKING_ACTIONS) for action in actions)
        if not looking:
            self._marked = None
        try:
            quiet_since = None
            if screenshot is not None:
                if looking:
                    quiet_since = self._settle.quiet_since()
                    if quiet_since is None and self._shows_marked():
                        # Damage since the mark that left every pixel as it was: a
                        # repaint (Chromium redraws after its processes were stopped).
                        quiet_since = self._settle.forgive()
                self._settle.find_programs()
                self._settle.arm()
            else:
                self._settle.pump()
            results: list[ActionResult] = []
            held = 0  # bytes of the batch's images and texts, all sent in one reply
            for action in actions:
                result = self._performed(action, space, len(results))
                held += _reply_bytes(result)
                if held > MAX_BATCH_REPLY_BYTES:
                    too_much = InvalidAction(
                        f"the batch's screenshots and texts add up to more than "
                        f"{MAX_BATCH_REPLY_BYTES >> 20} MiB at action {len(results)}: ask "
                        "for fewer, smaller or JPEG ones (its actions before it were done)")
                    too_much.action = len(results)
                    raise too_much
                results.append(result)
            image = None
            settled = True
            if screenshot is not None:
                self.pointer.sync()
                settled = self._settle.wait_quiet(
                    self.settle_options.quiet_s, self.settle_options.timeout_s, quiet_since,
                    self._shows_marked if looking else None,
                )
                image = self._screenshot(screenshot, space)
            return BatchResult(results, image, settled)
        except X_ERRORS as error:
            raise self._failure(error) from None

    def _performed(self, action: a.Action, space: Space, index: int) -> ActionResult:
        """:meth:`_perform`, a failure marked with the action's ``index`` in its batch: the
        host tells which action failed, the actions before it having been done."""
        try:
            return self._perform(action, space)
        except X_ERRORS as error:
            failure: DesktopError = self._failure(error)
        except DesktopError as error:
            failure = error
        failure.action = index
        raise failure from None

    def _perform(self, action: a.Action, space: Space) -> ActionResult:
        if isinstance(action, _KEYBOARD_ACTIONS):
            self._let_buttons_land(react=True)
            # Damage from here on is the keys' doing: _typing_shown waits for it to stop.
            self._settle.arm()
        if isinstance(action, _BUTTON_ACTIONS):
            # Clicks in a row race each other too: Chromium dropped the middle ones of three
            # clicks sent at once (one mousedown, then a mouseup at the last click's place).
            self._let_buttons_land()
            # Damage from here on is the click's doing: _let_buttons_land waits for it.
            self._settle.arm()
        result = self._dispatch(action, space)
        if isinstance(action, _BUTTON_ACTIONS):
            self._last_button_at = time.monotonic()
        return result

    def _watch_keymap_reads(self) -> KeymapWatch | None:
        try:
            return KeymapWatch(self.display_name, self._x)
        except Exception:  # noqa: BLE001 (no RECORD extension: Keyboard falls back to a grace)
            return None

    def _keymap_reread(self, since: float) -> None:
        """Until the clients have re-read a keyboard mapping changed at ``since`` (≤ 1 s
        times the patience). The quiet that ends the first wait, when the clients that
        re-read are learned, grows with the patience too: under TCG every character typed
        through a remapped key was lost now and then, likely because Chromium re-read
        later than the window manager plus 0.1 s and was never learned."""
        if self._keymap_watch is None:
            time.sleep(0.1)
        else:
            self._keymap_watch.wait_reread(since, timeout_s=1.0 * self._patience,
                                           quiet_s=0.1 * self._patience)

    def _typing_shown(self, typed_at: float, wait: bool = True) -> bool:
        """Until keys sent at ``typed_at`` have shown: the screen quiet for
        ``typing_quiet_s`` since then, at most until 1 s (times the patience) after it.
        Without ``wait``, only whether that is so now."""
        left_s = typed_at + 1.0 * self._patience - time.monotonic()
        if left_s <= 0:
            return True
        quiet_since = self._settle.quiet_since()
        return self._settle.wait_quiet(
            self.settle_options.typing_quiet_s, left_s if wait else 0.0,
            since=None if quiet_since is None else max(quiet_since, typed_at))

    def _let_buttons_land(self, react: bool = False) -> None:
        """After a recent button event, until the screen has gone quiet (30 ms); with
        ``react`` (keys follow), first until the X server has let the click through to its
        window. openbox's click-to-focus holds a click until it has had its turn; keys sent
        meanwhile go at once to the window focused before (a form's email typed into its
        name field with 4 desktops busy on 2 cores, tests/tasks/test_readme_tasks.py). Once
        the click is through, keys sent after it reach every client after it, and Chromium
        handles a frame's input in order.

        The quiet is what Chromium needs to hand the click to a cross-site iframe's process
        and learn from it that the iframe's field has the focus: without it, with 6 busy
        loops on 2 cores, 6 of 60 keys typed right after a click into such a field went to
        the page's own field. It counts from the click, not from the keys (keys long after a
        click that changed nothing go at once); on a screen that never goes quiet (an
        animation) it is given up after 0.15 s, where keys waited 0.5 s.

        Once per button event: the keys of a later action (the Return after typing that
        followed a click) no longer race it, so they do not wait for quiet again (30 ms or
        more while the page still redraws the typing)."""
        clicked = self._last_button_at
        if time.monotonic() - clicked < _BUTTON_RECENT_S:
            if react:
                # Its first query is a round trip too: the click's events are processed.
                self.pointer.wait_let_through(_BUTTON_LAND_MAX_S * self._patience)
            else:
                self.pointer.sync()
            clean_since = self._settle.quiet_since()
            quiet_s = self.settle_options.click_to_key_s
            self._settle.wait_quiet(
                quiet_s, quiet_s + _BUTTON_BUSY_S * self._patience,
                since=None if clean_since is None else max(clean_since, clicked),
            )
            self._last_button_at = 0.0  # landed (or given up on): no wait for it again

    def tap_keysym(self, keysym: int) -> None:
        """A live viewer's key that types a character off the layout (Keyboard.tap_keysym):
        typed here, the way ``type`` types one, once the screen has settled."""
        self._check_alive()
        self._marked = None
        try:
            self.keyboard.tap_keysym(keysym)
        except X_ERRORS as error:
            raise self._failure(error) from None

    def give_back_keycodes(self) -> None:
        """Keycodes lent beyond the few that stay lent go back (Keyboard.give_back_extra)
        if the keys typed on them have been read: the screen has been quiet for
        ``typing_quiet_s`` since, or the bound on waiting for that quiet (1 s times the
        patience) has passed. Never waits: the service calls this once the desktop has
        been idle for a while, and again after the next idle spell if the keys may still
        be unread (a guest under emulation, a screen that keeps moving)."""
        self._check_alive()
        if not self.keyboard.lends_extra:
            return
        try:
            self.keyboard.give_back_extra(lambda typed_at: self._typing_shown(typed_at, False))
        except X_ERRORS as error:
            raise self._failure(error) from None

    # -- one pointer action without blocking (the service runs it on its event loop) -----

    def send_pointer(
        self, action: a.Action, view: a.View | None, settle: a.SettleOptions | None,
    ) -> None:
        """``run([action])`` for a quick pointer action (:func:`sends_without_waiting`),
        without its round trip: the events are sent, and behind them a request whose reply
        says the X server has processed them. Call it only once :meth:`pointer_confirmed`;
        nothing here waits on the X server."""
        self._check_alive()
        if settle is not None:
            self.settle_options = settle
        self._marked = None
        try:
            # As run() and _perform: damage from here on is a button's doing.
            buttons = isinstance(action, _BUTTON_ACTIONS)
            if buttons:
                self._settle.arm()
            else:
                self._settle.pump()
            if not self._pointer_input(action, self.space(view)):
                raise AssertionError(f"{type(action).__name__} is not a pointer action")
            if buttons:
                self._last_button_at = time.monotonic()
            self._unconfirmed = self.pointer.start_sync()
        except X_ERRORS as error:
            raise self._failure(error) from None

    def pointer_confirmed(self) -> bool:
        """Read what the X server sent so far, without blocking; True once it has processed
        every event of the last :meth:`send_pointer` (the next one waits for it, and every
        other call through :meth:`confirm_pointer`)."""
        if self._unconfirmed is None:
            return True
        try:
            if not self.pointer.synced(self._unconfirmed):
                return False
        except X_ERRORS as error:
            raise self._failure(error) from None
        self._unconfirmed = None
        return True

    def confirm_pointer(self) -> None:
        """Block until :meth:`pointer_confirmed`: the capture reads the screen through a
        connection of its own, which the X server may serve before this one's events."""
        if not self.pointer_confirmed():
            try:
                self.pointer.sync()  # reads the awaited reply on its way
            except X_ERRORS as error:
                raise self._failure(error) from None
            self._unconfirmed = None

    def _pointer_input(self, action: a.Action, space: Space) -> bool:
        """Send a pointer action's events (no round trip after them); False if ``action``
        is not one."""
        match action:
            case a.Click():
                self._move_if(action.x, action.y, space)
                with self.keyboard.held(action.modifiers):
                    self.pointer.click(action.button, action.count)
            case a.Move():
                point = space.to_screen(action.x, action.y)
                with self.keyboard.held(action.modifiers):
                    self.pointer.move(*point)
            case a.MouseDown():
                self._move_if(action.x, action.y, space)
                self.pointer.down(action.button)
            case a.MouseUp():
                self._move_if(action.x, action.y, space)
                self.pointer.up(action.button)
            case a.Scroll():
                self._move_if(action.x, action.y, space)
                with self.keyboard.held(action.modifiers):
                    self.pointer.wheel(action.dx, action.dy)
            case _:
                return False
        return True

    def _dispatch(self, action: a.Action, space: Space) -> ActionResult:
        if self._pointer_input(action, space):
            self.pointer.sync()
            return None
        match action:
            case a.Screenshot():
                return self._screenshot(action, space)
            case a.Zoom():
                return self._zoom(action, space)
            case a.Drag():
                self._drag(action, space)
            case a.TypeText():
                self.keyboard.type_text(action.text)
            case a.Key():
                self.keyboard.press(action.keys)
            case a.HoldKey():
                self.keyboard.hold(action.keys, action.duration_s)
            case a.Wait():
                time.sleep(action.ms / 1000)
            case a.CursorPosition():
                # The window manager's click-to-focus freezes the pointer from a press
                # until it has had its turn: the moves behind the press wait, and the
                # pointer would be read where the press was.
                if time.monotonic() - self._last_button_at < _BUTTON_RECENT_S:
                    self.pointer.wait_let_through(_BUTTON_LAND_MAX_S * self._patience)
                x, y = space.from_screen(*self.pointer.position())
                return Point(x, y)
            case a.ScreenSize():
                return Size(space.view_width, space.view_height)
            case a.ClipboardGet():
                return ClipboardText(self.clipboard.get())
            case a.ClipboardSet():
                self.clipboard.set(action.text)
        self.pointer.sync()
        return None

    def _move_if(self, x: int | None, y: int | None, space: Space) -> None:
        if (x is None) != (y is None):
            raise InvalidAction("give both x and y, or neither (to act where the pointer is)")
        if x is not None and y is not None:
            self.pointer.move(*space.to_screen(x, y))

    def _drag(self, action: a.Drag, space: Space) -> None:
        points = [space.to_screen(x, y) for x, y in action.path]
        self.pointer.move(*points[0])
        # Held from before the press to after the release: a page reads a shift-drag
        # (extend the selection) or a ctrl-drag (copy) from the press and the release.
        with self.keyboard.held(action.modifiers):
            self._press_along(action.button, points)

    def _press_along(self, button: a.Button, points: list[tuple[int, int]]) -> None:
        self.pointer.down(button)
        try:
            for point in points[1:]:
                self.pointer.sync()
                # Clients merge motion events that queue up together (Chromium keeps only the
                # last), so each point gets a frame's time to be read on its own.
                time.sleep(self.settle_options.drag_step_s)
                self.pointer.move(*point)
            # The last point gets its frame too: Chromium starts a drag-and-drop of selected
            # content on a motion, and a release queued behind that motion left its drag
            # loop waiting, the pointer held where the drag began (tests/clients/test_sdk.py).
            self.pointer.sync()
            time.sleep(self.settle_options.drag_step_s)
        finally:
            self.pointer.up(button)

    # -- screenshots ----------------------------------------------------------------------

    def _screenshot(self, action: a.Screenshot, space: Space) -> EncodedImage:
        if action.region is not None:
            x, y, width, height = space.region_to_screen(action.region)
            out = (action.region.width, action.region.height)
        else:
            x, y, width, height = 0, 0, self.width, self.height
            out = (space.view_width, space.view_height)
        if action.scale is not None:
            out = (action.scale.width, action.scale.height)
        # A look at a screen that has not changed since the last one (no damage), asked for
        # alike, is that one's bytes: an agent polling a page, or a second client of the
        # session, pays at most a round trip instead of a capture and an encode. A look
        # that draws the cursor is always captured: the pointer moves without damage.
        key = (x, y, width, height, out, action.format, action.quality)
        changes = None if action.cursor else self._settle.changes()
        last = self._last_shot
        if changes is not None and last is not None and (last.key, last.changes) == (key, changes):
            self.screenshots_reused += 1
            return last.image
        frame = self._capturer.grab(x, y, width, height, action.cursor)
        image = encode(frame.scaled(*out), action.format, action.quality, self.strips)
        too_big = len(image.data) > REUSE_MAX_BYTES
        self._last_shot = None if changes is None or too_big else _Shot(key, changes, image)
        return image

    def _zoom(self, action: a.Zoom, space: Space) -> EncodedImage:
        x, y, width, height = space.region_to_screen(action.region)
        frame = self._capturer.grab(x, y, width, height, False)
        if action.scale is not None:
            frame = frame.scaled(action.scale.width, action.scale.height)
        return encode(frame, action.format, action.quality, self.strips)

    def mark(self) -> None:
        """Note the screen as it is (the host is about to checkpoint the sandbox): until
        an action changes it, a batch that only looks takes damage that left the screen
        exactly so for a repaint, and does not wait out a quiet window for it. The last
        look's bytes are let go: the checkpoint need not carry them."""
        self._last_shot = None
        self._marked = _digest(self.grab_screen())

    def _shows_marked(self) -> bool:
        """Whether the screen is the marked one; a screen that moved on forgets the mark
        (an animated page does not pay for a capture at every look)."""
        if self._marked is None:
            return False
        if _digest(self._capturer.grab(0, 0, self.width, self.height, False)) == self._marked:
            return True
        self._marked = None
        return False

    def grab_screen(self) -> Frame:
        """The whole screen's pixels, now (kept as the last frame of a paused session)."""
        self._check_alive()
        try:
            return self._capturer.grab(0, 0, self.width, self.height, False)
        except X_ERRORS as error:
            raise self._failure(error) from None

    # -- health and teardown --------------------------------------------------------------

    def _check_alive(self) -> None:
        if self._closed:
            raise DesktopFailed("the desktop has been stopped")

    def _failure(self, error: Exception) -> DesktopFailed:
        return DesktopFailed(f"the desktop failed: lost the X connection: {error}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.strips.close()
        with suppress(Exception):
            self._capturer.close()
        with suppress(Exception):
            self.clipboard.close()
        if self._keymap_watch is not None:
            self._keymap_watch.close()
        with suppress(Exception):
            self._x.close()


def _digest(frame: Frame) -> int:
    # A checksum, not a hash: a page crafted to collide would only get its screenshot
    # without a quiet window's wait. ISA-L's CRC-32 (zlib's, 12 times faster): 0.07 ms for
    # 1280x800, where zlib's takes 0.9 and blake2b 4.
    return isal_zlib.crc32(np.ascontiguousarray(frame.pixels).data)
