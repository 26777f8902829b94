"""Human handoff on the wire (API.md "Human handoff"): a human takes control of a session
in its live view and hands it back; the agent asks for help and can wait for it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from .scalars import IntOnly

__all__ = ["DEFAULT_LEASE_S", "ControlRequest", "Handoff", "HelpRequest"]

DEFAULT_LEASE_S = 600


class ControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # How long the human holds the desktop unless they hand it back first.
    lease_s: Annotated[int, Field(ge=1, le=86_400), IntOnly] = DEFAULT_LEASE_S


class HelpRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=1000)]


class Handoff(BaseModel):
    """Who drives the session: ``human_in_control`` until ``until`` (the lease) unless
    handed back; ``needs_help`` from the agent's request until a human takes control."""

    human_in_control: bool
    since: datetime | None = None
    until: datetime | None = None
    needs_help: bool
    reason: str | None = None
    requested_at: datetime | None = None
    handed_back_at: datetime | None = None
