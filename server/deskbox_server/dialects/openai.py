"""OpenAI's computer-use tool: a ``computer_call``'s action(s) → ``computer_call_output``.

The request body is the ``action`` object of a ``computer_call``, or a wrapper carrying
it: ``{"call_id": ..., "action": {...}}``, ``{"call_id": ..., "actions": [...]}`` (the
batched form), or the whole ``computer_call`` item (its other fields are ignored). The
answer is the ``computer_call_output`` item to send back, with ``call_id`` when the request
had one, and always a screenshot, taken once the screen has settled after the last action.

Translation:

- ``click`` buttons ``left|right|wheel|back|forward`` (``wheel`` is the middle button);
  ``keys`` on click, double_click, scroll, move and drag are key names held meanwhile (a
  drag's from before its press to after its release).
- ``scroll``: ``scroll_x`` / ``scroll_y`` are pixels (positive: right / down) of the
  model's coordinate space, as its ``x`` and ``y`` are. Our wheel moves in notches:
  ``PIXELS_PER_NOTCH`` = 100 screen px per notch, rounded away from zero, so any non-zero
  distance scrolls at least one notch (250 px → 3 notches, -40 px → -1).
- ``keypress``: ``keys`` are pressed together, in order, and released in reverse. Names
  come upper-case (``CTRL``, ``SHIFT``, ``ENTER``, ``ARROWLEFT``, ``SPACE``, ``A``): names
  are matched without regard to case, and a single letter means its key (``["CTRL", "A"]``
  is ctrl+a; ``["SHIFT", "A"]`` types a capital A).
- ``wait`` waits ``WAIT_MS`` (1 s); ``screenshot`` does nothing but the answer.

Unknown fields are ignored (vendors add fields; rejecting them would break clients).
"""

from __future__ import annotations

import base64
import math
from typing import Annotated, Any, Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..media import EncodedImage
from ..schemas import actions as a
from ..schemas.scalars import IntOnly
from .plan import Plan, build, type_actions

__all__ = [
    "PIXELS_PER_NOTCH",
    "WAIT_MS",
    "ComputerAction",
    "ComputerCall",
    "ComputerCallOutput",
    "ScreenshotOutput",
    "key_name",
    "notches",
    "render",
    "to_plan",
]

PIXELS_PER_NOTCH = 100
WAIT_MS = 1000
MAX_BATCH = 100
MAX_SCROLL_PX = 1000 * PIXELS_PER_NOTCH

_BUTTONS: dict[str, a.MouseButton] = {
    "left": "left", "right": "right", "wheel": "middle", "back": "back", "forward": "forward",
}

KeyName = Annotated[str, Field(min_length=1, max_length=40)]
Keys = Annotated[list[KeyName] | None, Field(max_length=8)]
ScrollPx = Annotated[int, Field(ge=-MAX_SCROLL_PX, le=MAX_SCROLL_PX), IntOnly]


class _Action(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ClickAction(_Action):
    type: Literal["click"]
    button: Literal["left", "right", "wheel", "back", "forward"] = "left"
    x: a.Coordinate
    y: a.Coordinate
    keys: Keys = None


class DoubleClickAction(_Action):
    type: Literal["double_click"]
    x: a.Coordinate
    y: a.Coordinate
    keys: Keys = None


class ScrollAction(_Action):
    type: Literal["scroll"]
    x: a.Coordinate
    y: a.Coordinate
    scroll_x: ScrollPx = 0
    scroll_y: ScrollPx = 0
    keys: Keys = None


class TypeAction(_Action):
    type: Literal["type"]
    text: Annotated[str, Field(max_length=a.MAX_TYPE_CHARS)]


class KeypressAction(_Action):
    type: Literal["keypress"]
    keys: Annotated[list[KeyName], Field(min_length=1, max_length=8)]


class WaitAction(_Action):
    type: Literal["wait"]


class ScreenshotAction(_Action):
    type: Literal["screenshot"]


class MoveAction(_Action):
    type: Literal["move"]
    x: a.Coordinate
    y: a.Coordinate
    keys: Keys = None


class PathPoint(_Action):
    x: a.Coordinate
    y: a.Coordinate


class DragAction(_Action):
    type: Literal["drag"]
    path: Annotated[list[PathPoint], Field(min_length=2, max_length=a.MAX_DRAG_POINTS)]
    keys: Keys = None


ComputerAction = Annotated[
    ClickAction
    | DoubleClickAction
    | ScrollAction
    | TypeAction
    | KeypressAction
    | WaitAction
    | ScreenshotAction
    | MoveAction
    | DragAction,
    Field(discriminator="type"),
]


class ComputerCall(BaseModel):
    """One action, or ``{"call_id"?, "action" | "actions"}`` (e.g. a whole ``computer_call``)."""

    model_config = ConfigDict(extra="ignore")

    call_id: Annotated[str | None, Field(max_length=256)] = None
    action: ComputerAction | None = None
    actions: Annotated[list[ComputerAction] | None, Field(min_length=1, max_length=MAX_BATCH)] = (
        None
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_action(cls, data: Any) -> Any:
        # A wrapper names its call even when it lost its action: say that, not "no type".
        if isinstance(data, dict) and not {"action", "actions", "call_id"} & data.keys():
            return {"action": data}
        return data

    @model_validator(mode="after")
    def _one_form(self) -> ComputerCall:
        if (self.action is None) == (self.actions is None):
            raise ValueError("give either action or actions")
        waits = sum(isinstance(action, WaitAction) for action in self.all_actions())
        if waits * WAIT_MS > a.MAX_WAIT_MS:
            raise ValueError(f"the waits of a call ({WAIT_MS // 1000} s each) may add up to "
                             f"{a.MAX_WAIT_MS // 1000} s at most, as a batch's do")
        return self

    def all_actions(self) -> list[ComputerAction]:
        if self.actions is not None:
            return self.actions
        assert self.action is not None
        return [self.action]


class ScreenshotOutput(BaseModel):
    type: Literal["computer_screenshot"] = "computer_screenshot"
    image_url: str


class ComputerCallOutput(BaseModel):
    type: Literal["computer_call_output"] = "computer_call_output"
    call_id: str | None = None
    output: ScreenshotOutput


# -- translation --------------------------------------------------------------------------


def key_name(name: str) -> str:
    """An OpenAI key name → ours (the driver matches names without regard to case)."""
    if name == "+":
        return "plus"
    if name == " ":
        return "space"
    if len(name) == 1 and name.isalpha():
        return name.lower()
    return name.strip()


def notches(pixels: int) -> int:
    """Pixels → wheel notches, ``PIXELS_PER_NOTCH`` each, rounded away from zero."""
    return int(math.copysign(math.ceil(abs(pixels) / PIXELS_PER_NOTCH), pixels)) if pixels else 0


def _held(keys: list[str] | None) -> list[str]:
    """The names of ``keys``, checked before anything runs (plan.check_call)."""
    return [key_name(key) for key in keys or []]


def _translate(action: ComputerAction, scale: tuple[float, float]) -> tuple[a.Action, ...]:
    match action:
        case ClickAction():
            return (build(a.Click, x=action.x, y=action.y, button=_BUTTONS[action.button],
                          modifiers=_held(action.keys)),)
        case DoubleClickAction():
            return (build(a.Click, x=action.x, y=action.y, count=2,
                          modifiers=_held(action.keys)),)
        case ScrollAction():
            dx = notches(round(action.scroll_x * scale[0]))
            dy = notches(round(action.scroll_y * scale[1]))
            return (build(a.Scroll, x=action.x, y=action.y, dx=dx, dy=dy,
                          modifiers=_held(action.keys)),)
        case TypeAction():
            return type_actions(action.text)
        case KeypressAction():
            combo = "+".join(_held(action.keys))
            return (build(a.Key, keys=combo),)
        case WaitAction():
            return (a.Wait(ms=WAIT_MS),)
        case ScreenshotAction():
            return ()
        case MoveAction():
            return (build(a.Move, x=action.x, y=action.y, modifiers=_held(action.keys)),)
        case DragAction():
            return (build(a.Drag, path=[(p.x, p.y) for p in action.path],
                          modifiers=_held(action.keys)),)
        case _:
            assert_never(action)


def to_plan(
    call: ComputerCall, shot: a.Screenshot, scale: tuple[float, float] = (1.0, 1.0)
) -> Plan:
    """Every action of the call in order, then a settled screenshot (just one if none act).

    ``scale``: screen pixels per pixel of the model's coordinate space (x, y), which its
    scroll distances are in: a model told of a display half the screen's size scrolls by
    its own pixels, twice as many of the screen's."""
    actions = tuple(ours for action in call.all_actions() for ours in _translate(action, scale))
    return Plan(actions, shot) if actions else Plan((shot,))


def render(image: EncodedImage, call_id: str | None) -> ComputerCallOutput:
    data = base64.b64encode(image.data).decode("ascii")
    url = f"data:{image.media_type};base64,{data}"
    return ComputerCallOutput(call_id=call_id, output=ScreenshotOutput(image_url=url))
