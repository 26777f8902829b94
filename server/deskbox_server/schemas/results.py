"""Results of actions that answer with data (other actions answer with an empty object)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ClipboardText", "Point", "Size"]


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
