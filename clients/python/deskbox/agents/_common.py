"""What both vendor adapters share: the model's display size, the session calls they make,
and reading a vendor SDK's answers as plain JSON.

The translation of the vendors' tool inputs is the server's (``/actions/anthropic``,
``/actions/openai``, API.md): the adapters post the model's input as it is, with the size
the model was told as ``coordinate_space``, so the server maps the model's coordinates to
screen pixels and shrinks the screenshots to that size, with one rounding rule both ways.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .._errors import DeskboxError
from .._models import AnthropicResult, Display, OpenAIResult

__all__ = [
    "DEFAULT_MAX_PIXELS",
    "JPEG_QUALITY",
    "ActionError",
    "ImageFormat",
    "RunResult",
    "SessionLike",
    "as_dict",
    "fit_display",
    "image_options",
]

#: Anthropic recommends telling the model at most about XGA/FWXGA (1366x768): bigger
#: screenshots are downscaled by the API anyway, and the model's clicks get less precise.
DEFAULT_MAX_PIXELS = 1366 * 768

ImageFormat = Literal["png", "jpeg", "webp"]
#: Quality of JPEG and WebP screenshots: text stays legible to the model.
JPEG_QUALITY = 80


class ActionError(DeskboxError):
    """A tool call the adapter cannot send (not an object, or for another tool).

    The adapters send it back to the model as a failed tool result; they never raise it.
    """


class SessionLike(Protocol):
    """What the adapters need of a session: :class:`deskbox.Session` is one."""

    @property
    def display(self) -> Display: ...

    def act_anthropic(
        self,
        tool_input: Mapping[str, Any],
        *,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002
        quality: int | None = None,
        timeout: float | None = None,
    ) -> AnthropicResult: ...

    def act_openai(
        self,
        action: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        call_id: str | None = None,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002
        quality: int | None = None,
        timeout: float | None = None,
    ) -> OpenAIResult: ...


def image_options(image_format: ImageFormat) -> dict[str, Any]:
    """``format`` and ``quality`` of the screenshots sent to the model."""
    return {"format": image_format, "quality": None if image_format == "png" else JPEG_QUALITY}


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
