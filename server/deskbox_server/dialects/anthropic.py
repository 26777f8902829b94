"""Anthropic's ``computer`` tool (``computer_20250124`` and ``computer_20251124``).

The request body is the ``input`` object of a ``tool_use`` block; the answer is the
``content`` of the matching ``tool_result`` block. Field meanings:

- ``coordinate`` / ``start_coordinate``: ``[x, y]`` in the session's coordinate space.
- ``text``: the text to type (``type``), the xdotool-style keys to press (``key``:
  ``"ctrl+s"``, several combos separated by spaces are pressed one after another) or to
  hold (``hold_key``), and for clicks and ``scroll`` the modifier keys held meanwhile
  (``"shift"``, ``"ctrl+shift"``).
- ``scroll_direction`` and ``scroll_amount`` (wheel notches); ``duration`` in seconds
  (``hold_key``, ``wait``); ``region`` ``[x1, y1, x2, y2]`` (``zoom``, 20251124).

Every action that acts answers with a screenshot taken once the screen has settled, as the
tool's reference implementation answers each action with a screenshot; ``screenshot`` and
``zoom`` answer with their image, ``cursor_position`` with the text ``X=…,Y=…``. Unknown
fields are ignored (vendors add fields; the reference implementation ignores them too).
"""

from __future__ import annotations

import base64
import re
from typing import Annotated, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..media import EncodedImage
from ..schemas import actions as a
from ..schemas.results import Point
from ..schemas.scalars import IntOnly, NumberOnly
from .plan import Plan, build, check_keys, type_actions

__all__ = [
    "ACTION_NAMES",
    "ComputerInput",
    "ContentBlock",
    "ImageBlock",
    "ImageSource",
    "TextBlock",
    "render",
    "to_plan",
]

MAX_NOTCHES = 1000
MAX_KEY_TEXT = 1000

Coordinate = tuple[a.Coordinate, a.Coordinate]
_BUTTONS: dict[str, tuple[a.MouseButton, int]] = {
    "left_click": ("left", 1),
    "right_click": ("right", 1),
    "middle_click": ("middle", 1),
    "double_click": ("left", 2),
    "triple_click": ("left", 3),
}
_SEPARATORS = re.compile(r"[+\s]+")


class _Input(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ScreenshotInput(_Input):
    action: Literal["screenshot"]


class ClickInput(_Input):
    action: Literal["left_click", "right_click", "middle_click", "double_click", "triple_click"]
    coordinate: Coordinate | None = None
    text: Annotated[str | None, Field(max_length=200, description="modifier keys to hold")] = (
        None
    )
    key: Annotated[str | None, Field(max_length=200, description="alias of text")] = None


class MouseMoveInput(_Input):
    action: Literal["mouse_move"]
    coordinate: Coordinate


class DragInput(_Input):
    action: Literal["left_click_drag"]
    start_coordinate: Coordinate
    coordinate: Coordinate


class MouseButtonInput(_Input):
    action: Literal["left_mouse_down", "left_mouse_up"]
    coordinate: Coordinate | None = None


class ScrollInput(_Input):
    action: Literal["scroll"]
    scroll_direction: Literal["up", "down", "left", "right"]
    scroll_amount: Annotated[int, Field(ge=0, le=MAX_NOTCHES), IntOnly]
    coordinate: Coordinate | None = None
    text: Annotated[str | None, Field(max_length=200, description="modifier keys to hold")] = (
        None
    )


class TypeInput(_Input):
    action: Literal["type"]
    text: Annotated[str, Field(max_length=a.MAX_TYPE_CHARS)]


class KeyInput(_Input):
    action: Literal["key"]
    text: Annotated[str, Field(min_length=1, max_length=MAX_KEY_TEXT)]


class HoldKeyInput(_Input):
    action: Literal["hold_key"]
    text: Annotated[str, Field(min_length=1, max_length=200)]
    duration: Annotated[float, Field(ge=0, le=a.MAX_HOLD_S), NumberOnly]


class WaitInput(_Input):
    action: Literal["wait"]
    duration: Annotated[float, Field(ge=0, le=a.MAX_WAIT_MS / 1000), NumberOnly] = 1.0


class CursorPositionInput(_Input):
    action: Literal["cursor_position"]


class ZoomInput(_Input):
    action: Literal["zoom"]
    region: tuple[a.Coordinate, a.Coordinate, a.Coordinate, a.Coordinate]

    @model_validator(mode="after")
    def _ordered(self) -> ZoomInput:
        x1, y1, x2, y2 = self.region
        if x2 <= x1 or y2 <= y1:
            raise ValueError("region must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1")
        return self


ComputerInput = Annotated[
    ScreenshotInput
    | ClickInput
    | MouseMoveInput
    | DragInput
    | MouseButtonInput
    | ScrollInput
    | TypeInput
    | KeyInput
    | HoldKeyInput
    | WaitInput
    | CursorPositionInput
    | ZoomInput,
    Field(discriminator="action"),
]

ACTION_NAMES = (
    "screenshot", *_BUTTONS, "mouse_move", "left_click_drag", "left_mouse_down",
    "left_mouse_up", "scroll", "type", "key", "hold_key", "wait", "cursor_position", "zoom",
)


# -- answers ------------------------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ImageSource(BaseModel):
    type: Literal["base64"] = "base64"
    media_type: str
    data: str


class ImageBlock(BaseModel):
    type: Literal["image"] = "image"
    source: ImageSource


ContentBlock = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


# -- translation --------------------------------------------------------------------------


def _modifiers(text: str | None) -> list[str]:
    """ "ctrl+shift" (or "ctrl shift") → ["ctrl", "shift"]; checked before anything runs
    (plan.check_call)."""
    return [name for name in _SEPARATORS.split(text or "") if name]


def _xy(coordinate: Coordinate | None) -> dict[str, int]:
    return {} if coordinate is None else {"x": coordinate[0], "y": coordinate[1]}


def to_plan(tool_input: ComputerInput, shot: a.Screenshot) -> Plan:
    """The actions for one tool input; ``shot`` is the format of the answer's images."""
    settled: tuple[a.Action, ...]
    match tool_input:
        case ScreenshotInput():
            return Plan((shot,))
        case ZoomInput(region=(x1, y1, x2, y2)):
            region = build(a.Region, x=x1, y=y1, width=x2 - x1, height=y2 - y1)
            return Plan((build(a.Zoom, region=region, format=shot.format,
                               quality=shot.quality),))
        case CursorPositionInput():
            return Plan((a.CursorPosition(),))
        case ClickInput():
            button, count = _BUTTONS[tool_input.action]
            modifiers = _modifiers(tool_input.text or tool_input.key)
            settled = (build(a.Click, button=button, count=count, modifiers=modifiers,
                             **_xy(tool_input.coordinate)),)
        case MouseMoveInput(coordinate=(x, y)):
            settled = (build(a.Move, x=x, y=y),)
        case DragInput():
            settled = (build(a.Drag, path=[tool_input.start_coordinate, tool_input.coordinate]),)
        case MouseButtonInput():
            if tool_input.action == "left_mouse_down":
                settled = (build(a.MouseDown, button="left", **_xy(tool_input.coordinate)),)
            else:
                settled = (build(a.MouseUp, button="left", **_xy(tool_input.coordinate)),)
        case ScrollInput():
            amount = tool_input.scroll_amount
            dx, dy = {
                "up": (0, -amount), "down": (0, amount),
                "left": (-amount, 0), "right": (amount, 0),
            }[tool_input.scroll_direction]
            settled = (build(a.Scroll, dx=dx, dy=dy, modifiers=_modifiers(tool_input.text),
                             **_xy(tool_input.coordinate)),)
        case TypeInput():
            settled = type_actions(tool_input.text)
        case KeyInput():
            # xdotool's "key" takes several combos separated by spaces, pressed in turn.
            # Names are checked with the call's points (plan.check_call); no key at all
            # is no action to check.
            combos = tool_input.text.split()
            if not combos:
                check_keys([""])
            settled = tuple(build(a.Key, keys=combo) for combo in combos)
        case HoldKeyInput():
            if not tool_input.text.strip():
                check_keys([""])
            settled = (build(a.HoldKey, keys=tool_input.text.strip(),
                             duration_s=tool_input.duration),)
        case WaitInput():
            settled = (build(a.Wait, ms=round(tool_input.duration * 1000)),)
        case _:
            assert_never(tool_input)
    return Plan(settled, shot)


def render(answer: EncodedImage | Point) -> list[TextBlock | ImageBlock]:
    """The ``tool_result`` content for an answer."""
    if isinstance(answer, Point):
        return [TextBlock(text=f"X={answer.x},Y={answer.y}")]
    data = base64.b64encode(answer.data).decode("ascii")
    return [ImageBlock(source=ImageSource(media_type=answer.media_type, data=data))]
