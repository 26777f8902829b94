"""The public names of the host's agent client, pinned (a change is a decision)."""

from __future__ import annotations

import deskbox_server.agent as agent


def test_exported_names() -> None:
    assert sorted(agent.__all__) == [
        "AgentClient", "AgentLimits", "CallResult", "Channel", "ExecChunk", "ExecStatus",
        "Hello", "PROTOCOL",
    ]
    for name in agent.__all__:
        assert hasattr(agent, name)
