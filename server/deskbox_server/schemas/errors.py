"""The error body of API.md: every non-2xx answer, whatever failed (api/errors.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ErrorBody", "ErrorDetail"]


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="snake_case kind: invalid_request, not_found, conflict, ...")
    message: str = Field(description="a human sentence saying what went wrong")
    request_id: str = Field(description="also in the X-Request-Id header and the server log")
    action_index: int | None = Field(
        default=None, description="for a batch of actions: the index of the one that failed, "
        "those before it done and those after it not; absent when no one action did")


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail
