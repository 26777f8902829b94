"""Wire models of session tokens (API.md "Conventions")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from .scalars import IntOnly

__all__ = ["TokenCreate", "TokenIssued"]

MAX_TTL_S = 7 * 24 * 3600


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scope: Literal["view", "control", "cdp"]
    ttl_s: Annotated[int, Field(ge=1, le=MAX_TTL_S), IntOnly] = 600


class TokenIssued(BaseModel):
    """The token itself is shown here only; revoke it by ``id``."""

    id: str
    token: str
    scope: Literal["view", "control", "cdp"]
    session_id: str
    expires_at: datetime
