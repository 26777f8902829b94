"""A desktop (a sandbox's, or the local backend's), driven through its agent (the
``act``, ``grab``, ``ready``, ``info`` and ``watch`` calls of desktop_image/agent/PROTOCOL.md).

:class:`AgentDesktop` takes the server's own action models and answers with the server's
types (``BatchResult``, ``EncodedImage``, ``Frame``): a session needs nothing else to drive
its desktop. Every byte of an answer is hostile: the reply's JSON header and each
part are bounded by what the request asked for (an image by its expected width × height ×
4 plus a little), offsets and lengths are checked against the body, images must be of the
format and size asked; anything else fails the agent's connection with ``AgentFailed``.
The agent's refusals come back as the server's errors: ``invalid_action`` as
``InvalidAction`` (422), ``desktop_failed`` as ``DesktopFailed``.

The screen's size, which bounds full-screen images, is asked once (``info``) when first
needed and kept: a session's X server keeps its size for life (``info()`` asks again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from deskbox_agent.desktop import actions as agent_actions
from deskbox_agent.desktop.errors import InvalidAction as AgentInvalidAction
from deskbox_agent.desktop.space import Space

from .. import untrusted_json
from ..errors import (
    Conflict,
    DeskboxError,
    DesktopFailed,
    InvalidAction,
    InvalidRequest,
    SessionFailed,
    Timeout,
)
from ..media import MEDIA_TYPES, EncodedImage, Frame
from ..schemas import actions as a
from ..schemas.results import ActionResult, BatchResult, ClipboardText, Point, Size
from ..settle import SettleOptions, batch_allowance_s
from .client import AgentClient, CallResult, Json
from .inflate import inflate_exact

__all__ = ["PARTS_TYPE", "AgentDesktop", "DesktopInfo", "PackedFrame"]

PARTS_TYPE = "application/vnd.deskbox.parts"
MAX_HEADER = 1 << 20  # the JSON header of a parts reply: results of at most 1000 actions
IMAGE_SLACK = 64 * 1024  # container overhead past the raw pixels (PNG chunks, JPEG tables)
MAX_CLIPBOARD_BYTES = 4 * 200_000  # the agent's cap in characters, 4 bytes each in UTF-8
_SMALL_BODY = 64 * 1024
_LENGTH = struct.Struct(">I")
_MAGIC = {"image/jpeg": (b"\xff\xd8\xff",), "image/png": (b"\x89PNG\r\n\x1a\n",),
          "image/webp": (b"RIFF",)}
_READY_GRACE_S = 5.0
# ``watch``: past its own timeout the agent still captures and encodes (≈ 10 ms) once.
_WATCH_GRACE_S = 5.0
MAX_READY_CALL_S = 300.0  # the longest ``ready`` the agent accepts (PROTOCOL.md)


@dataclass(frozen=True)
class DesktopInfo:
    display: str
    width: int
    height: int
    capture: str


@dataclass(frozen=True)
class _Expect:
    """What one result must be: its kind, and for an image its format and size."""

    kind: Literal["none", "image", "point", "size", "clipboard"]
    media_type: str = ""
    width: int = 0
    height: int = 0

    @property
    def max_bytes(self) -> int:
        if self.kind == "image":
            return self.width * self.height * 4 + IMAGE_SLACK
        return MAX_CLIPBOARD_BYTES if self.kind == "clipboard" else 0


class AgentDesktop:
    """One session's desktop over its agent; calls are async and each has a timeout."""

    def __init__(
        self, client: AgentClient, settle: SettleOptions | None = None,
        call_timeout_s: float = 30.0, held: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``held``: why the desktop stands still by someone else's doing, not ours
        (engines/base.py Sandbox.held), asked when a call does not return in time."""
        self._client = client
        self._held = held
        self.settle_options = settle or SettleOptions()
        self.call_timeout_s = call_timeout_s
        self._screen: tuple[int, int] | None = None
        self._settle_sent: tuple[SettleOptions, dict[str, Json]] | None = None

    # -- the calls ------------------------------------------------------------------------

    async def info(self) -> DesktopInfo:
        value = (await self._call("info", {}, self.call_timeout_s, _SMALL_BODY)).json()
        if not isinstance(value, dict):
            raise self._client.fail("info: not a JSON object")
        width, height = value.get("width"), value.get("height")
        display, capture = value.get("display"), value.get("capture")
        if not (_side(width) and _side(height) and isinstance(display, str)
                and isinstance(capture, str) and len(display) <= 64 and len(capture) <= 64):
            raise self._client.fail("info: not {display, width, height, capture}")
        assert isinstance(width, int) and isinstance(height, int)
        # Every frame and image the host takes is sized from this screen: no larger than
        # a session's largest display (schemas/sessions.py), so that a lying agent cannot
        # make the host inflate or hold gigabytes.
        if width * height > a.MAX_PIXELS:
            raise self._client.fail(f"info: a screen of {width}x{height}, over the "
                                    f"{a.MAX_PIXELS} pixels of the largest display")
        self._screen = (width, height)
        return DesktopInfo(display, width, height, capture)

    async def ready(self, browser: bool, timeout_s: float) -> dict[str, float]:
        """Waits (in the agent, by X events) for the window manager and, with ``browser``,
        Chromium's painted window; returns seconds to each stage.

        The agent waits at most ``MAX_READY_CALL_S`` per call (PROTOCOL.md): a longer wait
        (a start timeout set high for a slow host) asks again until its own deadline; a
        stage's seconds then count from the call that saw it, plus the calls before."""
        started = time.monotonic()
        while True:
            waited = time.monotonic() - started
            left = timeout_s - waited
            chunk = max(0.1, min(left, MAX_READY_CALL_S))
            try:
                timings = await self._ready_once(browser, chunk)
            except Timeout:
                if left <= MAX_READY_CALL_S:
                    raise
                continue
            return {stage: waited + seconds for stage, seconds in timings.items()}

    async def _ready_once(self, browser: bool, timeout_s: float) -> dict[str, float]:
        value = (await self._call("ready", {"browser": browser, "timeout_s": timeout_s},
                                  timeout_s + _READY_GRACE_S, _SMALL_BODY,
                                  stall_fails=False)).json()
        stages = ("xserver", "wm", "browser", "painted") if browser else ("xserver", "wm")
        timings: dict[str, float] = {}
        if isinstance(value, dict) and set(value) == set(stages):
            for stage in stages:
                seconds = value[stage]
                if type(seconds) in (int, float) and 0 <= float(seconds) <= timeout_s + 1:  # type: ignore[arg-type]
                    timings[stage] = float(seconds)  # type: ignore[arg-type]
        if len(timings) != len(stages):
            raise self._client.fail(f"ready: not {{{', '.join(stages)}: seconds}}")
        return timings

    async def run(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        """Run ``actions`` in order; then, if asked, a screenshot once the screen settled."""
        space = await self._space(view, actions, screenshot)
        expects = [self._expect(action, space) for action in actions]
        final = self._expect(screenshot, space) if screenshot is not None else None
        body_cap = _LENGTH.size + MAX_HEADER + sum(e.max_bytes for e in expects) + (
            final.max_bytes if final is not None else 0)
        request: dict[str, Json] = {
            "actions": [action.model_dump(mode="json") for action in actions],
            "view": view.model_dump(mode="json") if view is not None else None,
            "screenshot": screenshot.model_dump(mode="json") if screenshot is not None else None,
            "settle": self._settle_json(),
        }
        timeout_s = self.call_timeout_s + batch_allowance_s(
            actions, screenshot, self.settle_options)
        try:
            result = await self._call("act", request, timeout_s, body_cap)
        except DeskboxError as error:
            if error.action_index is not None and error.action_index >= len(actions):
                error.action_index = None  # an agent's word about an action not sent
            raise
        header, parts = self._split(result.content_type, result.body)
        results, settled = header.get("results"), header.get("settled")
        shot = header.get("screenshot")
        if not isinstance(results, list) or len(results) != len(actions):
            raise self._client.fail(f"act: results is not a list of {len(actions)}")
        if type(settled) is not bool:
            raise self._client.fail("act: settled is not true or false")
        values = [self._result(r, e, parts, i) for i, (r, e) in enumerate(zip(results, expects,
                                                                              strict=True))]
        image: EncodedImage | None = None
        if final is not None:
            image = self._image(shot, final, parts, "act: screenshot")
        elif shot is not None:
            raise self._client.fail("act: a screenshot nobody asked for")
        return BatchResult(values, image, settled)

    async def perform(self, action: a.Action, view: a.CoordinateSpace | None = None,
                      ) -> ActionResult:
        return (await self.run([action], view)).results[0]

    async def capture(
        self, fmt: Literal["jpeg", "png", "webp"] = "jpeg", quality: int = 75,
        view: a.CoordinateSpace | None = None,
    ) -> EncodedImage:
        """The whole screen, now (no settling)."""
        image = await self.perform(a.Screenshot(format=fmt, quality=quality), view)
        assert isinstance(image, EncodedImage)
        return image

    async def grab(self) -> Frame:
        """The whole screen's raw pixels, now (the frozen frame of a paused session)."""
        return await (await self.grab_packed()).unpack()

    async def grab_packed(self) -> PackedFrame:
        """The whole screen as the agent sent it: deflated by an agent that offers it (a
        4 MB frame took the stream ~20 ms). Its size and encoding are checked here, its
        pixels by :meth:`PackedFrame.unpack`."""
        width, height = await self._screen_size()
        size = width * height * 4
        deflated = "grab_deflated" in self._client.hello_info.calls
        # Deflate's worst case: stored blocks, a few bytes per 64 KiB.
        cap = size + size // 256 + 1024 if deflated else size
        result = await self._call("grab_deflated" if deflated else "grab", {},
                                  self.call_timeout_s, _LENGTH.size + MAX_HEADER + cap)
        header, parts = self._split(result.content_type, result.body)
        if (header.get("width"), header.get("height"), header.get("pixel_format")) != (
                width, height, "bgrx"):
            raise self._client.fail(f"grab: not the {width}x{height} bgrx frame of the screen")
        if header.get("encoding", "raw") != ("deflate" if deflated else "raw"):
            raise self._client.fail(f"grab: pixels encoded as {header.get('encoding')!r}")
        pixels = self._part(header.get("pixels"), parts, cap, "grab: pixels")
        return PackedFrame(self._client, pixels, width, height, deflated)

    async def tap_keysym(self, keysym: int) -> bool:
        """Have the agent type a live viewer's key that types a character off the layout
        (PROTOCOL.md ``tap_keysym``); False from an agent without the call."""
        if "tap_keysym" not in self._client.hello_info.calls:
            return False
        await self._call("tap_keysym", {"keysym": keysym}, self.call_timeout_s, _SMALL_BODY)
        return True

    async def mark(self) -> None:
        """Have the agent note the screen as it is now (before a checkpoint): until an
        action, its looks take a repaint that changes no pixel for no change."""
        await self._call("mark", {}, self.call_timeout_s, _SMALL_BODY)

    async def watch(self, timeout_s: float, quality: int, now: bool = False,
                    ) -> EncodedImage | None:
        """The whole screen as JPEG once it changed since the last ``watch``'s capture (at
        once with ``now``); None if it did not within ``timeout_s``. On a stream of its
        own (it waits for seconds), so that the call stream stays free."""
        width, height = await self._screen_size()
        expect = _Expect("image", "image/jpeg", width, height)
        result = await self._call(
            "watch", {"timeout_s": timeout_s, "quality": quality, "now": now},
            timeout_s + _WATCH_GRACE_S, _LENGTH.size + MAX_HEADER + expect.max_bytes,
            stall_fails=False)
        header, parts = self._split(result.content_type, result.body)
        changed, image = header.get("changed"), header.get("image")
        if set(header) != {"changed", "image"} or type(changed) is not bool or (
                changed != (image is not None)):
            raise self._client.fail("watch: not {changed, image}")
        return None if image is None else self._image(image, expect, parts, "watch: image")

    # -- plumbing -------------------------------------------------------------------------

    async def _call(self, name: str, args: dict[str, Json], timeout_s: float,
                    max_body: int, stall_fails: bool = True) -> CallResult:
        """``stall_fails``: a call past its deadline means a desktop that stopped answering
        (its X server stopped or grabbed, the agent hung): every later call would queue
        behind it, so the whole connection fails with that reason."""
        # ``ready`` waits for the browser for seconds: on a stream of its own, so that the
        # call stream stays free for the rest.
        call = self._client.call if stall_fails else self._client.call_alone
        try:
            return await call(name, args, timeout_s=timeout_s, max_body=max_body)
        except Timeout as error:
            if not stall_fails:
                raise
            if (held := self._held()) is not None:
                # Not a stalled desktop: it goes on when unpaused, and the call with it.
                raise Conflict(f"{held} (the {name} call sent before may still run then)"
                               ) from None
            stalled = f"the desktop did not answer within {timeout_s:.0f} s ({name})"
            self._client.fail(stalled)
            raise DesktopFailed(stalled) from error
        except InvalidRequest as error:
            reason = _agent_reason(error.message, "invalid_action")
            if reason is not None:
                raise _at_same_action(InvalidAction(reason), error) from None
            raise
        except SessionFailed as error:
            reason = _agent_reason(error.message, "desktop_failed")
            if reason is not None:
                raise _at_same_action(DesktopFailed(reason), error) from None
            raise

    def _settle_json(self) -> dict[str, Json]:
        """The settle options as the request carries them, made once per options object
        (``dataclasses.asdict`` deep-copies: 50 µs, a tenth of a click's host time)."""
        options = self.settle_options
        if self._settle_sent is None or self._settle_sent[0] is not options:
            self._settle_sent = (options, dataclasses.asdict(options))
        return self._settle_sent[1]

    async def _screen_size(self) -> tuple[int, int]:
        if self._screen is None:
            await self.info()
        assert self._screen is not None
        return self._screen

    async def _space(
        self, view: a.CoordinateSpace | None, actions: Sequence[a.Action],
        screenshot: a.Screenshot | None,
    ) -> Space:
        """The screen and the view results are in; the screen's size is asked once, when
        a result's size depends on it."""
        if view is None:
            needs_screen = screenshot is not None or any(
                isinstance(action, a.Screenshot | a.Zoom | a.ScreenSize | a.CursorPosition)
                for action in actions)
        else:
            needs_screen = any(isinstance(action, a.Zoom) for action in actions)
        width, height = await self._screen_size() if needs_screen else (0, 0)
        if view is None:
            return Space(width, height, width, height)
        return Space(width, height, view.width, view.height)

    @staticmethod
    def _expect(action: a.Action | a.Screenshot, space: Space) -> _Expect:
        match action:
            case a.Screenshot():
                size = ((space.view_width, space.view_height) if action.region is None
                        else (action.region.width, action.region.height))
                if action.scale is not None:
                    size = (action.scale.width, action.scale.height)
                return _Expect("image", MEDIA_TYPES[action.format], *size)
            case a.Zoom():
                # At the screen's own resolution unless scaled (the agent's zoom).
                if action.scale is not None:
                    size = (action.scale.width, action.scale.height)
                else:
                    region = agent_actions.Region(action.region.x, action.region.y,
                                                  action.region.width, action.region.height)
                    try:  # the agent's own mapping, so that sizes agree by construction
                        size = space.region_to_screen(region)[2:]
                    except AgentInvalidAction as error:
                        raise InvalidAction(error.message) from None
                return _Expect("image", MEDIA_TYPES[action.format], *size)
            case a.CursorPosition():
                return _Expect("point", width=space.view_width, height=space.view_height)
            case a.ScreenSize():
                return _Expect("size", width=space.view_width, height=space.view_height)
            case a.ClipboardGet():
                return _Expect("clipboard")
        return _Expect("none")

    def _split(self, content_type: str, body: bytes) -> tuple[dict[str, Any], memoryview]:
        if content_type != PARTS_TYPE:
            raise self._client.fail(f"a desktop call answered {content_type[:64]!r}, "
                                    f"not {PARTS_TYPE}")
        if len(body) < _LENGTH.size:
            raise self._client.fail("a parts reply shorter than its length field")
        (length,) = _LENGTH.unpack_from(body)
        if length > MAX_HEADER or _LENGTH.size + length > len(body):
            raise self._client.fail(
                f"a parts reply's header of {length} bytes (at most {MAX_HEADER}, "
                f"and within the {len(body)}-byte body)")
        try:
            header = untrusted_json.loads(body[_LENGTH.size : _LENGTH.size + length])
        except ValueError as error:
            raise self._client.fail(f"a parts reply's header is not JSON: {error}") from None
        if not isinstance(header, dict):
            raise self._client.fail("a parts reply's header is not a JSON object")
        return header, memoryview(body)[_LENGTH.size + length :]

    def _part(self, place: object, parts: memoryview, max_bytes: int, what: str) -> bytes:
        offset = place.get("offset") if isinstance(place, dict) else None
        length = place.get("length") if isinstance(place, dict) else None
        if type(offset) is not int or type(length) is not int:
            raise self._client.fail(f"{what}: no integer offset and length")
        if not (0 <= offset and 0 <= length <= max_bytes and offset + length <= len(parts)):
            raise self._client.fail(
                f"{what}: {length} bytes at {offset} (at most {max_bytes}, within the "
                f"{len(parts)} bytes of parts)")
        return bytes(parts[offset : offset + length])

    def _image(self, value: object, expect: _Expect, parts: memoryview, what: str,
               ) -> EncodedImage:
        if not isinstance(value, dict) or value.get("type") != "image":
            raise self._client.fail(f"{what}: not an image")
        if value.get("media_type") != expect.media_type or (
                value.get("width"), value.get("height")) != (expect.width, expect.height):
            raise self._client.fail(
                f"{what}: not the {expect.width}x{expect.height} {expect.media_type} asked for")
        data = self._part(value, parts, expect.max_bytes, what)
        if not data.startswith(_MAGIC[expect.media_type]) or (
                expect.media_type == "image/webp" and data[8:12] != b"WEBP"):
            raise self._client.fail(f"{what}: the bytes are not {expect.media_type}")
        return EncodedImage(expect.media_type, data, expect.width, expect.height)

    def _result(self, value: object, expect: _Expect, parts: memoryview, index: int,
                ) -> ActionResult:
        what = f"act: results[{index}]"
        if expect.kind == "none":
            if value is not None:
                raise self._client.fail(f"{what}: a result for an action that has none")
            return None
        if expect.kind == "image":
            return self._image(value, expect, parts, what)
        if not isinstance(value, dict) or value.get("type") != expect.kind:
            raise self._client.fail(f"{what}: not a {expect.kind}")
        if expect.kind == "clipboard":
            data = self._part(value, parts, expect.max_bytes, what)
            try:
                return ClipboardText(text=data.decode("utf-8"))
            except UnicodeDecodeError:
                raise self._client.fail(f"{what}: clipboard text is not UTF-8") from None
        if expect.kind == "point":
            x, y = value.get("x"), value.get("y")
            if not (type(x) is int and type(y) is int and 0 <= x < expect.width
                    and 0 <= y < expect.height):
                raise self._client.fail(
                    f"{what}: not a point in the {expect.width}x{expect.height} view")
            return Point(x=x, y=y)
        if (value.get("width"), value.get("height")) != (expect.width, expect.height):
            raise self._client.fail(f"{what}: not the {expect.width}x{expect.height} size")
        return Size(width=expect.width, height=expect.height)


def _side(value: object) -> bool:
    return type(value) is int and 1 <= value <= a.MAX_SIDE


def _agent_reason(message: str, kind: str) -> str | None:
    """The agent's own message when it refused with ``kind`` (client.py writes them as
    ``agent: <kind>: <message>``)."""
    prefix = f"agent: {kind}: "
    return message[len(prefix):] if message.startswith(prefix) else None


_E = TypeVar("_E", bound=DeskboxError)


def _at_same_action(error: _E, agents: DeskboxError) -> _E:
    """``error`` in place of the agent's, for the same action of the batch."""
    error.action_index = agents.action_index
    return error


@dataclass(frozen=True)
class PackedFrame:
    """A grab as the agent sent it. Unpacking it (inflating 4 MB takes a couple of
    milliseconds) is a step of its own, so that a pause can freeze the sandbox meanwhile."""

    client: AgentClient
    data: bytes
    width: int
    height: int
    deflated: bool

    async def unpack(self) -> Frame:
        """The pixels; a frame that is not the screen's fails the agent's connection."""
        width, height, size = self.width, self.height, self.width * self.height * 4
        pixels: bytes | bytearray = self.data
        if self.deflated:
            inflated = await asyncio.to_thread(inflate_exact, self.data, size)
            if inflated is None:
                raise self.client.fail(
                    f"grab: the deflated pixels are not {size} bytes ({width}x{height})")
            pixels = inflated
        if len(pixels) != size:
            raise self.client.fail(f"grab: {len(pixels)} bytes for {width}x{height} pixels")
        view = np.frombuffer(pixels, dtype=np.uint8).reshape(height, width, 4)
        view.flags.writeable = False  # a frame is never changed, whatever holds its bytes
        return Frame(view)

