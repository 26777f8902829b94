"""What the host accepts from an agent: every bound of the client in one place."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AgentLimits"]

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class AgentLimits:
    # HTTP/2 settings we announce; h2 enforces them and the frame guard checks them first.
    max_frame_size: int = 128 * KIB  # fewer frames for a screenshot; a frame waits whole
    max_header_list_size: int = 16 * KIB
    max_header_block: int = 32 * KIB  # compressed HEADERS + CONTINUATION bytes of one block
    stream_window: int = 1 * MIB  # what one stream may have unread here
    connection_window: int = 8 * MIB  # what may be in flight to us on all streams at once
    # Unread data of all streams together past which the connection window is no longer
    # handed back: so at most this + connection_window is held here per connection.
    buffer_budget: int = 32 * MIB
    max_streams: int = 128  # streams we open at once (fewer if the agent says so)
    # Frames that carry no payload for a live stream (SETTINGS, PING, PRIORITY, empty DATA,
    # unknown types, tiny WINDOW_UPDATEs): a burst allowance and a refill rate per second.
    junk_burst: int = 1000
    junk_per_s: float = 200.0
    read_chunk: int = 256 * KIB
    handshake_timeout_s: float = 5.0  # the agent's SETTINGS and the answer to /v1/hello
    write_timeout_s: float = 10.0  # an agent that stops reading what we send
    close_timeout_s: float = 2.0  # for the agent to hang up its end once we close ours
    call_timeout_s: float = 30.0  # default for one RPC, head and body
    exec_grace_s: float = 10.0  # past an exec's own timeout: for the agent to kill and report
    max_rpc_body: int = 64 * MIB  # default cap of one RPC's response body
    max_error_body: int = 4 * KIB
