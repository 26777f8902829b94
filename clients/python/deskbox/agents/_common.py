"""What both vendor adapters share: the model's display size, the steps a tool call becomes,
running them on a session, and reading a vendor SDK's answers as plain JSON.

Coordinate scaling is the server's job (API.md, ``coordinate_space``): every ``act`` carries
the size the model was told, so the server maps the model's coordinates to screen pixels,
and shrinks the screenshots to that size, with one rounding rule for both directions.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .._errors import DeskboxError
from .._models import ActionsResult, Display, Screenshot

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "JPEG_QUALITY",
    "ActionError",
    "ImageFormat",
    "RunResult",
    "SessionLike",
    "Step",
    "as_dict",
    "fit_display",
    "perform",
]

#: Anthropic recommends telling the model at most about XGA/FWXGA (1366x768): bigger
#: screenshots are downscaled by the API anyway, and the model's clicks get less precise.
DEFAULT_MAX_PIXELS = 1366 * 768

ImageFormat = Literal["png", "jpeg", "webp"]
#: Quality of JPEG and WebP screenshots: text stays legible to the model.
JPEG_QUALITY = 80


class ActionError(DeskboxError):
    """A tool call the adapter cannot run (a missing or malformed field, an unknown action).

    The adapters send it back to the model as a failed tool result; they never raise it.
    """


class SessionLike(Protocol):
    """What the adapters need of a session: :class:`deskbox.Session` is one."""

    @property
    def display(self) -> Display: ...

    def act(
        self,
        actions: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        screenshot: bool | Mapping[str, Any] | None = None,
        coordinate_space: tuple[int, int] | None = None,
        timeout: float | None = None,
    ) -> ActionsResult: ...


def fit_display(width: int, height: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """The display size to tell a model: ``width`` x ``height`` shrunk, keeping its aspect
    ratio, until it has at most ``max_pixels`` pixels (1280x800 stays, 1920x1080 → 1366x768)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"no display size to fit: {width}x{height}")
    if width * height <= max_pixels:
        return width, height
    factor = math.sqrt(max_pixels / (width * height))
    # Rounded (16:9 → exactly 1366x768), unless rounding up goes over the budget.
    fitted = max(1, round(width * factor)), max(1, round(height * factor))
    if fitted[0] * fitted[1] > max_pixels:
        fitted = max(1, math.floor(width * factor)), max(1, math.floor(height * factor))
    return fitted


@dataclass(frozen=True)
class Step:
    """Deskbox actions for one tool call, and what answers it: a screenshot taken once the
    screen has settled after them (``settled``), or the last action's own result
    (``result``: a ``screenshot``'s or ``zoom``'s image, a ``cursor_position``)."""

    actions: tuple[dict[str, Any], ...]
    answer: Literal["settled", "result"] = "settled"


def perform(
    session: SessionLike,
    step: Step,
    space: tuple[int, int] | None,
    image_format: ImageFormat,
) -> Screenshot | dict[str, Any]:
    """Run ``step`` in one ``act`` call, with coordinates and images in ``space``."""
    if step.answer == "settled":
        shot: dict[str, Any] = {"format": image_format}
        if image_format != "png":
            shot["quality"] = JPEG_QUALITY
        done = session.act(list(step.actions), screenshot=shot, coordinate_space=space)
        if done.screenshot is None:
            raise ActionError("the server answered without the screenshot it was asked for")
        return done.screenshot
    done = session.act(list(step.actions), coordinate_space=space)
    return done.results[-1]


def screenshot_action(image_format: ImageFormat) -> dict[str, Any]:
    action: dict[str, Any] = {"type": "screenshot", "format": image_format}
    if image_format != "png":
        action["quality"] = JPEG_QUALITY
    return action


def b64(screenshot: Screenshot) -> str:
    return base64.b64encode(screenshot.data).decode("ascii")


def as_dict(value: Any) -> dict[str, Any]:
    """A vendor SDK object (a pydantic model, as both SDKs return) or a mapping → a dict.

    ``None`` fields are dropped: the SDKs' models carry them for absent fields, and sending
    them back to the API can be refused.
    """
    if isinstance(value, Mapping):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump(mode="json", exclude_none=True)
        if isinstance(dumped, dict):
            return dumped
    raise TypeError(f"expected a mapping or a pydantic model, got {type(value).__name__}")


def number_pair(value: Any, name: str) -> tuple[int, int]:
    """``[x, y]`` → (x, y); anything else is the model's mistake, sent back to it."""
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        return round(value[0]), round(value[1])
    raise ActionError(f"{name} must be [x, y] (integers), got {value!r}")


def integer(value: Any, name: str) -> int:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return round(value)
    raise ActionError(f"{name} must be a number, got {value!r}")


def text(value: Any, name: str) -> str:
    if isinstance(value, str):
        return value
    raise ActionError(f"{name} must be a string, got {value!r}")


@dataclass
class RunResult:
    """How a :func:`run` ended.

    ``stop_reason``: ``"done"`` (the model answered without using the tool),
    ``"max_steps"`` (it was still using it) or, for OpenAI, ``"safety_check"`` (a pending
    safety check was declined). ``text`` is the model's last text; ``transcript`` the
    conversation as sent (Anthropic: the ``messages``; OpenAI: every output and input item
    in order); ``steps`` how many model calls were made.
    """

    text: str
    stop_reason: str
    steps: int
    transcript: list[dict[str, Any]] = field(default_factory=list)
