"""Engines make sandboxes and open a byte stream to each one's agent; everything above them
is engine-agnostic (engines/base.py)."""

from __future__ import annotations

from typing import Any

from .base import (
    Capability,
    Engine,
    EngineLacks,
    Sandbox,
    SessionSpec,
    StartTogether,
    VolumeAttach,
)

__all__ = ["AnyEngine", "Capability", "Engine", "EngineLacks", "Sandbox", "SessionSpec",
           "StartTogether", "VolumeAttach"]

AnyEngine = Engine[Any]
