"""Deskbox control plane and desktop driver."""

__version__ = "0.1.0"
