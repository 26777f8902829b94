"""What ``GET /healthz`` says of the server and of each engine it offers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["EngineSummary", "Health"]


class EngineSummary(BaseModel):
    capabilities: list[str] = Field(
        description="what the engine offers beyond start and stop: freeze, checkpoint, "
        "exec, resources, adopt"
    )
    egress: list[str] = Field(description="the network egress modes it accepts")
    details: dict[str, str] = Field(
        default_factory=dict,
        description="facts of this host, e.g. a VM engine's accelerator (kvm or tcg) and why",
    )


class Health(BaseModel):
    status: Literal["ok", "degraded"] = Field(
        description="degraded: something keeps sessions from starting or saving (problems)")
    problems: list[str] = Field(
        default_factory=list,
        description="what is wrong now, e.g. an engine's daemon that does not answer, or a "
        "state dir nearly full")
    sessions: int
    engines: dict[str, EngineSummary] = Field(
        description="the engines sessions may ask for with \"backend\", by that name"
    )
