"""Deskbox: disposable desktops for computer-use agents (Python client and CLI)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
