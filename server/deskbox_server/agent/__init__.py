"""The host's side of the agent protocol (desktop_image/agent/PROTOCOL.md).

:class:`AgentClient` speaks HTTP/2 (the host is the client) over one byte stream to the
``deskbox-agent`` inside a sandbox; the stream comes from the engine (a unix socket for
runc, a virtio-serial port for a VM, TCP for a pod). The agent is hostile: see
``connection.py`` for the bounds.
"""

from __future__ import annotations

from .client import PROTOCOL, AgentClient, CallResult, Channel, ExecChunk, ExecStatus, Hello
from .limits import AgentLimits

__all__ = [
    "PROTOCOL",
    "AgentClient",
    "AgentLimits",
    "CallResult",
    "Channel",
    "ExecChunk",
    "ExecStatus",
    "Hello",
]
