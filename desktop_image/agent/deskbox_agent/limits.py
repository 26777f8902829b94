"""Every bound the agent keeps, in one place (PROTOCOL.md "Limits")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Limits:
    max_concurrent_streams: int = 128
    max_header_list_size: int = 16 * KIB
    max_frame_size: int = 16 * KIB  # the HTTP/2 minimum: what the host must accept anyway
    stream_window: int = 1 * MIB  # per stream, both directions
    connection_window: int = 8 * MIB
    buffer_budget: int = 32 * MIB  # unread by all handlers, past which the host must wait
    max_request_body: int = 1 * MIB  # JSON bodies of RPCs; files and channels stream
    max_file_size: int = 1024 * MIB
    max_exec_output: int = 16 * MIB  # stdout and stderr each; more is dropped, flagged
    max_exec_timeout_s: float = 24 * 3600.0
    request_body_timeout_s: float = 30.0  # for the whole JSON body of an RPC
    settings_timeout_s: float = 10.0  # the host's preface and SETTINGS
    channel_connect_timeout_s: float = 5.0
    read_chunk: int = 64 * KIB
