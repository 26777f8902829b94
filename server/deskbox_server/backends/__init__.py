"""Backends make sandboxes; everything above them is backend-agnostic."""

from __future__ import annotations

from .base import Backend, DesktopHandle, SessionSpec

__all__ = ["Backend", "DesktopHandle", "SessionSpec"]
