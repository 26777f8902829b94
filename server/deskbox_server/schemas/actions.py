"""The action schema of API.md: a discriminated union on ``type``.

These models are what the driver executes; they bound every field a client controls
(text length, durations, path length) so that no action can make the driver work
without limit.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from .scalars import Bool, IntOnly, NumberOnly

__all__ = [
    "MAX_DRAG_POINTS",
    "MAX_CLIPBOARD_CHARS",
    "MAX_HOLD_S",
    "MAX_PIXELS",
    "MAX_TYPE_CHARS",
    "MAX_WAIT_MS",
    "Action",
    "ActionAdapter",
    "ClipboardGet",
    "ClipboardSet",
    "Click",
    "CoordinateSpace",
    "CursorPosition",
    "Drag",
    "HoldKey",
    "Key",
    "MouseButton",
    "MouseDown",
    "MouseUp",
    "Move",
    "Region",
    "ScaleTo",
    "Screenshot",
    "ScreenSize",
    "Scroll",
    "TypeText",
    "Wait",
    "Zoom",
]

MAX_TYPE_CHARS = 20_000
MAX_CLIPBOARD_CHARS = 200_000
MAX_WAIT_MS = 60_000
MAX_HOLD_S = 30.0
MAX_DRAG_POINTS = 10_000
MAX_SIDE = 16_384
# No image larger than the largest display (schemas/sessions.py): a 16384x16384 scale would
# make the server allocate gigabytes for one screenshot.
MAX_PIXELS = 7680 * 4320

MouseButton = Literal["left", "right", "middle", "back", "forward"]
ImageFormat = Literal["png", "jpeg", "webp"]
Coordinate = Annotated[int, Field(ge=0, le=MAX_SIDE), IntOnly]
Side = Annotated[int, Field(ge=1, le=MAX_SIDE), IntOnly]
Quality = Annotated[int, Field(ge=1, le=100), IntOnly]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Region(_Strict):
    x: Coordinate
    y: Coordinate
    width: Side
    height: Side


class _ImageSize(_Strict):
    width: Side
    height: Side

    @model_validator(mode="after")
    def _area(self) -> Self:
        if self.width * self.height > MAX_PIXELS:
            raise ValueError(
                f"{self.width}x{self.height} is more than {MAX_PIXELS} pixels (7680x4320)"
            )
        return self


class ScaleTo(_ImageSize):
    """The size of the image out (at most 7680x4320 pixels in all)."""


class CoordinateSpace(_ImageSize):
    """The W×H space a model sees; coordinates and screenshots are mapped to and from it
    (at most 7680x4320 pixels in all: screenshots come out at this size)."""


class Screenshot(_Strict):
    type: Literal["screenshot"] = "screenshot"
    format: ImageFormat = "jpeg"
    quality: Quality = 75
    region: Region | None = None
    scale: ScaleTo | None = None
    cursor: Bool = False


class Click(_Strict):
    type: Literal["click"] = "click"
    x: Coordinate | None = None
    y: Coordinate | None = None
    button: MouseButton = "left"
    count: Annotated[int, Field(ge=1, le=3), IntOnly] = 1
    modifiers: Annotated[list[str], Field(max_length=8)] = []


class Move(_Strict):
    type: Literal["move"] = "move"
    x: Coordinate
    y: Coordinate
    modifiers: Annotated[list[str], Field(max_length=8)] = []


class MouseDown(_Strict):
    type: Literal["mouse_down"] = "mouse_down"
    button: MouseButton = "left"
    x: Coordinate | None = None
    y: Coordinate | None = None


class MouseUp(_Strict):
    type: Literal["mouse_up"] = "mouse_up"
    button: MouseButton = "left"
    x: Coordinate | None = None
    y: Coordinate | None = None


class Drag(_Strict):
    type: Literal["drag"] = "drag"
    path: Annotated[
        list[tuple[Coordinate, Coordinate]], Field(min_length=2, max_length=MAX_DRAG_POINTS)
    ]
    button: MouseButton = "left"
    modifiers: Annotated[list[str], Field(max_length=8)] = []


class Scroll(_Strict):
    type: Literal["scroll"] = "scroll"
    x: Coordinate | None = None
    y: Coordinate | None = None
    dx: Annotated[int, Field(ge=-1000, le=1000), IntOnly] = 0
    dy: Annotated[int, Field(ge=-1000, le=1000), IntOnly] = 0
    modifiers: Annotated[list[str], Field(max_length=8)] = []


class TypeText(_Strict):
    """``text``, or the value of the API key's ``secret`` of that name, which the server
    types only into a focused field of one of the secret's allowed origins (API.md
    "Secrets"). ``secret`` never reaches the desktop: the server puts the value in ``text``."""

    type: Literal["type"] = "type"
    text: Annotated[str, Field(max_length=MAX_TYPE_CHARS)] = ""
    secret: Annotated[str | None, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
                                        exclude=True)] = None

    @model_validator(mode="after")
    def _text_or_secret(self) -> Self:
        if "text" not in self.model_fields_set and self.secret is None:
            raise ValueError("type needs text, or a secret's name")
        if self.text and self.secret is not None:
            raise ValueError("type takes text or a secret, not both")
        return self


class Key(_Strict):
    type: Literal["key"] = "key"
    keys: Annotated[str, Field(min_length=1, max_length=200)]


class HoldKey(_Strict):
    type: Literal["hold_key"] = "hold_key"
    keys: Annotated[str, Field(min_length=1, max_length=200)]
    duration_s: Annotated[float, Field(ge=0, le=MAX_HOLD_S), NumberOnly]


class Wait(_Strict):
    type: Literal["wait"] = "wait"
    ms: Annotated[int, Field(ge=0, le=MAX_WAIT_MS), IntOnly]


class CursorPosition(_Strict):
    type: Literal["cursor_position"] = "cursor_position"


class ScreenSize(_Strict):
    type: Literal["screen_size"] = "screen_size"


class Zoom(_Strict):
    """A region at full resolution: never shrunk to the coordinate space."""

    type: Literal["zoom"] = "zoom"
    region: Region
    scale: ScaleTo | None = None
    format: ImageFormat = "png"
    quality: Quality = 75


class ClipboardGet(_Strict):
    """The text on the session's clipboard (X ``CLIPBOARD``) → ``{"text": ...}``."""

    type: Literal["clipboard_get"] = "clipboard_get"


class ClipboardSet(_Strict):
    """Put ``text`` on the session's clipboard (then e.g. ``key ctrl+v`` pastes it)."""

    type: Literal["clipboard_set"] = "clipboard_set"
    text: Annotated[str, Field(max_length=MAX_CLIPBOARD_CHARS)]


Action = Annotated[
    Screenshot
    | Click
    | Move
    | MouseDown
    | MouseUp
    | Drag
    | Scroll
    | TypeText
    | Key
    | HoldKey
    | Wait
    | CursorPosition
    | ScreenSize
    | Zoom
    | ClipboardGet
    | ClipboardSet,
    Field(discriminator="type"),
]

ActionAdapter: TypeAdapter[Action] = TypeAdapter(Action)
