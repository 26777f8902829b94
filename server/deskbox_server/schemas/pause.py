"""Wire models of ``POST /v1/sessions/{id}/pause``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["PauseMode", "PauseRequest"]

PauseMode = Literal["freeze", "hibernate"]


class PauseRequest(BaseModel):
    """``freeze`` stops every process where it stands and keeps its memory (resume in
    milliseconds); ``hibernate`` checkpoints the sandbox to disk and frees its memory."""

    model_config = ConfigDict(extra="forbid")

    mode: PauseMode = "freeze"
