"""Results of actions that answer with data (other actions answer with an empty object),
and of a batch of them as the session layer hands it to the API."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from ..media import EncodedImage

__all__ = ["ActionResult", "BatchResult", "ClipboardText", "Point", "Size"]


class Point(BaseModel):
    model_config = ConfigDict(frozen=True)
    x: int
    y: int


class Size(BaseModel):
    model_config = ConfigDict(frozen=True)
    width: int
    height: int


class ClipboardText(BaseModel):
    model_config = ConfigDict(frozen=True)
    text: str


ActionResult = EncodedImage | Point | Size | ClipboardText | None


@dataclass(frozen=True)
class BatchResult:
    results: list[ActionResult]
    screenshot: EncodedImage | None
    settled: bool
