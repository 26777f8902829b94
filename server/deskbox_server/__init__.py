"""Deskbox control plane and desktop driver."""
