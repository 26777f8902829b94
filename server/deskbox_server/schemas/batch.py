"""Wire models of action requests and their answers (API.md "Actions" and "Streams")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .actions import MAX_WAIT_MS, Action, CoordinateSpace, HoldKey, Screenshot, Wait
from .results import ClipboardText, Point, Size
from .scalars import IntOnly

__all__ = [
    "MAX_BATCH",
    "REQUEST_KEYS",
    "ActionResultOut",
    "ActionsRequest",
    "ActionsResponse",
    "EmptyResult",
    "ImageOut",
    "WsImage",
    "WsRequest",
]

MAX_BATCH = 1000
REQUEST_KEYS = ("screenshot", "coordinate_space")  # a request's, not its action's


class ActionsRequest(BaseModel):
    """``{"actions": [...]}``, or one action object (its ``type`` at the top level).

    Either form may carry ``screenshot`` (taken once the screen has settled after the last
    action) and ``coordinate_space``.
    """

    model_config = ConfigDict(extra="forbid")

    actions: Annotated[list[Action], Field(min_length=1, max_length=MAX_BATCH)]
    screenshot: Screenshot | None = None
    coordinate_space: CoordinateSpace | None = None

    @model_validator(mode="after")
    def _bounded_waits(self) -> ActionsRequest:
        # Each wait and hold is capped; so is their sum, or 1,000 of them would hold the
        # session's worker (and every later action) for hours.
        waited_ms = sum(
            action.ms if isinstance(action, Wait) else action.duration_s * 1000
            for action in self.actions if isinstance(action, Wait | HoldKey)
        )
        if waited_ms > MAX_WAIT_MS:
            raise ValueError(
                f"the waits and holds of a batch may add up to {MAX_WAIT_MS // 1000} s at most"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _single_action(cls, data: Any) -> Any:
        if isinstance(data, dict) and "actions" not in data and "type" in data:
            action = {k: v for k, v in data.items() if k not in REQUEST_KEYS}
            return {"actions": [action], **{k: data[k] for k in REQUEST_KEYS if k in data}}
        return data


class ImageOut(BaseModel):
    media_type: str
    data_b64: str
    width: int
    height: int


class EmptyResult(BaseModel):
    """The result of an action that answers with nothing: ``{}``."""

    model_config = ConfigDict(extra="forbid")


ActionResultOut = ImageOut | Point | Size | ClipboardText | EmptyResult


class ActionsResponse(BaseModel):
    results: list[ActionResultOut]
    screenshot: ImageOut | None = None
    settled: bool = True


class WsRequest(BaseModel):
    """One websocket text message: ``{"id": 7, "action": {...}}``."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[int, IntOnly] | Annotated[str, Field(max_length=128)]
    action: Action
    screenshot: Screenshot | None = None
    coordinate_space: CoordinateSpace | None = None


class WsImage(BaseModel):
    """An image announced in a websocket reply; its bytes follow as one binary frame."""

    media_type: str
    width: int
    height: int
    size: int
