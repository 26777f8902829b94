"""Anthropic's ``computer`` tool (``computer_20250124``, ``computer_20251124``) on a session::

    import anthropic
    from deskbox import Deskbox
    from deskbox.agents import anthropic as claude

    with Deskbox() as box, box.sessions.create(start_url="https://example.org") as session:
        result = claude.run(anthropic.Anthropic(), session, "What is the page's heading?")
        print(result.text)

:func:`run` is a whole agent loop. For your own loop, :class:`ComputerTool` gives the tool
definition (``tools=[tool.definition]``, ``betas=[tool.beta]``) and turns each ``tool_use``
block into its ``tool_result`` block (``tool.execute(block)``).

How a tool call runs: :func:`to_step` turns its ``input`` into Deskbox actions, run by one
``session.act`` call that also returns the screenshot taken once the screen has settled.
The server has an ``/actions/anthropic`` endpoint for this dialect, but the SDK has no call
for it; going through ``act`` works over HTTP and over the actions websocket
(``with session.actions_ws(): ...``) alike, and runs the same translation the server's
dialect does. Coordinates and screenshots are in the model's display size
(:attr:`ComputerTool.display`): the server scales them (``coordinate_space``).

Failures the model can act on (a malformed input, an unknown key, a point off the
screen, a paused or failed session: :class:`~deskbox.APIError`, :class:`ActionError`)
come back as ``is_error`` tool results; a server that cannot be reached raises
:class:`~deskbox.APIConnectionError`, as there is nothing the model could do about it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from .._errors import APIError
from .._models import Screenshot
from ._common import (
    DEFAULT_MAX_PIXELS,
    ActionError,
    ImageFormat,
    RunResult,
    SessionLike,
    Step,
    as_dict,
    b64,
    fit_display,
    integer,
    number_pair,
    perform,
    screenshot_action,
    text,
)

__all__ = [
    "BETAS",
    "DEFAULT_MODEL",
    "AnthropicClient",
    "ComputerTool",
    "ToolVersion",
    "render",
    "run",
    "to_step",
]

ToolVersion = Literal["computer_20250124", "computer_20251124"]
#: The ``betas=[...]`` flag each tool version needs.
BETAS: dict[str, str] = {
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
}
DEFAULT_MODEL = "claude-sonnet-4-5"
OMITTED_IMAGE = "(an older screenshot, left out to save context)"

_CLICKS: dict[str, tuple[str, int]] = {
    "left_click": ("left", 1),
    "right_click": ("right", 1),
    "middle_click": ("middle", 1),
    "double_click": ("left", 2),
    "triple_click": ("left", 3),
}
_SCROLL: dict[str, tuple[int, int]] = {
    "up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0),
}
_SEPARATORS = re.compile(r"[+\s]+")


class _Messages(Protocol):
    # (*args, **kwargs) matches any signature: the SDK's fully typed create() fits.
    def create(self, *args: Any, **kwargs: Any) -> Any: ...


class _Beta(Protocol):
    @property
    def messages(self) -> _Messages: ...


class AnthropicClient(Protocol):
    """What :func:`run` uses of a model client: ``anthropic.Anthropic()`` is one."""

    @property
    def beta(self) -> _Beta: ...


# -- translation --------------------------------------------------------------------------


def _xy(value: Any, name: str = "coordinate") -> dict[str, int]:
    x, y = number_pair(value, name)
    return {"x": x, "y": y}


def _maybe_xy(value: Any) -> dict[str, int]:
    return {} if value is None else _xy(value)


def _modifiers(value: Any) -> list[str]:
    """Modifier keys held during a click or scroll: ``"ctrl+shift"`` or ``"ctrl shift"``."""
    if value is None:
        return []
    return [name for name in _SEPARATORS.split(text(value, "text")) if name]


def to_step(tool_input: Mapping[str, Any], image_format: ImageFormat = "png") -> Step:
    """The Deskbox actions for one ``input`` of the computer tool (raises :class:`ActionError`).

    ``key`` takes xdotool-style combos (``"ctrl+l"``, ``"Return"``); several separated by
    spaces are pressed one after the other, as xdotool does.
    """
    action = tool_input.get("action")
    get = tool_input.get
    if action == "screenshot":
        return Step((screenshot_action(image_format),), "result")
    if action == "cursor_position":
        return Step(({"type": "cursor_position"},), "result")
    if action == "zoom":
        region = get("region")
        if not (isinstance(region, list | tuple) and len(region) == 4):
            raise ActionError(f"region must be [x1, y1, x2, y2], got {region!r}")
        x1, y1 = number_pair(region[:2], "region")
        x2, y2 = number_pair(region[2:], "region")
        box = {"x": x1, "y": y1, "width": x2 - x1, "height": y2 - y1}
        return Step(({"type": "zoom", "region": box, "format": image_format},), "result")
    if isinstance(action, str) and action in _CLICKS:
        button, count = _CLICKS[action]
        click: dict[str, Any] = {"type": "click", "button": button, "count": count,
                                 **_maybe_xy(get("coordinate"))}
        if held := _modifiers(get("text") or get("key")):
            click["modifiers"] = held
        return Step((click,))
    if action == "mouse_move":
        return Step(({"type": "move", **_xy(get("coordinate"))},))
    if action == "left_click_drag":
        start = number_pair(get("start_coordinate"), "start_coordinate")
        end = number_pair(get("coordinate"), "coordinate")
        return Step(({"type": "drag", "path": [list(start), list(end)], "button": "left"},))
    if action in ("left_mouse_down", "left_mouse_up"):
        kind = "mouse_down" if action == "left_mouse_down" else "mouse_up"
        return Step(({"type": kind, "button": "left", **_maybe_xy(get("coordinate"))},))
    if action == "scroll":
        direction = get("scroll_direction")
        if direction not in _SCROLL:
            raise ActionError(f"scroll_direction must be up, down, left or right: {direction!r}")
        amount = integer(get("scroll_amount"), "scroll_amount")
        sx, sy = _SCROLL[direction]
        scroll: dict[str, Any] = {"type": "scroll", "dx": sx * amount, "dy": sy * amount,
                                  **_maybe_xy(get("coordinate"))}
        if held := _modifiers(get("text")):
            scroll["modifiers"] = held
        return Step((scroll,))
    if action == "type":
        return Step(({"type": "type", "text": text(get("text"), "text")},))
    if action == "key":
        combos = text(get("text"), "text").split()
        if not combos:
            raise ActionError("key needs text: the keys to press, like 'ctrl+l'")
        return Step(tuple({"type": "key", "keys": combo} for combo in combos))
    if action == "hold_key":
        keys = text(get("text"), "text").strip()
        seconds = get("duration")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ActionError(f"duration must be a number of seconds, got {seconds!r}")
        return Step(({"type": "hold_key", "keys": keys, "duration_s": float(seconds)},))
    if action == "wait":
        seconds = get("duration", 1.0)
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ActionError(f"duration must be a number of seconds, got {seconds!r}")
        return Step(({"type": "wait", "ms": round(seconds * 1000)},))
    raise ActionError(f"unknown action {action!r}")


def render(answer: Screenshot | Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``content`` of a ``tool_result`` for what a step answered."""
    if isinstance(answer, Screenshot):
        source = {"type": "base64", "media_type": answer.media_type, "data": b64(answer)}
        return [{"type": "image", "source": source}]
    if "x" in answer and "y" in answer:
        return [{"type": "text", "text": f"X={answer['x']},Y={answer['y']}"}]
    return [{"type": "text", "text": json.dumps(dict(answer))}]


def tool_error(tool_use_id: str, message: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "is_error": True,
            "content": [{"type": "text", "text": message}]}


# -- the tool -----------------------------------------------------------------------------


class ComputerTool:
    """The computer tool of one session, told a display of :attr:`display` pixels.

    ``display`` defaults to the session's display shrunk to at most ``max_pixels``
    (1366x768's worth: 1280x800 stays, 1920x1080 becomes 1366x768). ``enable_zoom`` lets
    ``computer_20251124`` models use ``zoom``. ``image_format`` is the screenshots' format.
    """

    name = "computer"

    def __init__(
        self,
        session: SessionLike,
        *,
        version: ToolVersion = "computer_20250124",
        display: tuple[int, int] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        image_format: ImageFormat = "png",
        enable_zoom: bool = False,
    ) -> None:
        if version not in BETAS:
            raise ValueError(f"unknown tool version {version!r}; known: {sorted(BETAS)}")
        self.session = session
        self.version = version
        self.image_format = image_format
        self.enable_zoom = enable_zoom
        screen = (session.display.width, session.display.height)
        self.display = display or fit_display(*screen, max_pixels)
        # Screen-sized models need no scaling: leave the session's own setting alone.
        self._space = None if self.display == screen else self.display

    @property
    def definition(self) -> dict[str, Any]:
        """For ``tools=[...]``."""
        tool: dict[str, Any] = {
            "type": self.version,
            "name": self.name,
            "display_width_px": self.display[0],
            "display_height_px": self.display[1],
        }
        if self.enable_zoom and self.version == "computer_20251124":
            tool["enable_zoom"] = True
        return tool

    @property
    def beta(self) -> str:
        """For ``betas=[...]``."""
        return BETAS[self.version]

    def execute(self, tool_use: Any) -> dict[str, Any]:
        """A ``tool_use`` block (a dict, or the SDK's object) → its ``tool_result`` block."""
        block = as_dict(tool_use)
        tool_use_id = str(block.get("id") or "")
        if block.get("name", self.name) != self.name:
            return tool_error(tool_use_id, f"there is no tool named {block.get('name')!r}")
        tool_input = block.get("input")
        try:
            if not isinstance(tool_input, Mapping):
                raise ActionError(f"the tool input must be an object, got {tool_input!r}")
            content = self.run_input(tool_input)
        except (APIError, ActionError) as error:
            return tool_error(tool_use_id, str(error))
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}

    def run_input(self, tool_input: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run one tool ``input``; its ``tool_result`` content (raises on failure)."""
        step = to_step(tool_input, self.image_format)
        return render(perform(self.session, step, self._space, self.image_format))


# -- the loop -----------------------------------------------------------------------------


def run(
    client: AnthropicClient,
    session: SessionLike,
    task: str,
    *,
    model: str = DEFAULT_MODEL,
    max_steps: int = 50,
    max_tokens: int = 4096,
    system: str | None = None,
    tool: ComputerTool | None = None,
    keep_images: int | None = None,
    **options: Any,
) -> RunResult:
    """Ask ``model`` to do ``task`` on ``session`` until it answers without the tool.

    Each step is one ``client.beta.messages.create(...)`` call (``options`` are passed on,
    e.g. ``thinking=...``) followed by the tool calls it asked for. ``keep_images`` keeps
    only that many of the latest screenshots in the conversation (older ones become a
    short text), which bounds the tokens a long task costs.
    """
    tool = tool or ComputerTool(session)
    if system is not None:
        options["system"] = system
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    content: list[dict[str, Any]] = []
    for step in range(1, max_steps + 1):
        response = as_dict(client.beta.messages.create(
            model=model, max_tokens=max_tokens, tools=[tool.definition], messages=messages,
            betas=[tool.beta], **options,
        ))
        content = [as_dict(block) for block in response.get("content") or []]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block.get("type") == "tool_use"]
        if not uses:
            return RunResult(_text(content), "done", step, messages)
        messages.append({"role": "user", "content": [tool.execute(use) for use in uses]})
        if keep_images is not None:
            _keep_latest_images(messages, keep_images)
    return RunResult(_text(content), "max_steps", max_steps, messages)


def _text(content: list[dict[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text")


def _keep_latest_images(messages: list[dict[str, Any]], keep: int) -> None:
    """Replace all but the ``keep`` latest screenshots in tool results by a short text."""
    seen = 0
    for message in reversed(messages):
        blocks = message.get("content")
        if message.get("role") != "user" or not isinstance(blocks, list):
            continue
        for result in reversed(blocks):
            inner = result.get("content") if result.get("type") == "tool_result" else None
            if not isinstance(inner, list):
                continue
            for index in reversed(range(len(inner))):
                if inner[index].get("type") != "image":
                    continue
                seen += 1
                if seen > keep:
                    inner[index] = {"type": "text", "text": OMITTED_IMAGE}
