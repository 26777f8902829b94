"""An h2 connection as both ends of the stream make one: our limits announced to the peer
and enforced on what it sends.

Both ends use it: the agent (h2server.py, the HTTP/2 server) and the host
(server/deskbox_server/agent/connection.py, the client, which imports it from this package).
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.settings

from . import h2speed

__all__ = ["new_connection"]


def new_connection(
    *, client_side: bool, header_encoding: str | None, max_header_list_size: int,
    max_frame_size: int, stream_window: int, max_concurrent_streams: int | None = None,
) -> h2.connection.H2Connection:
    """``max_concurrent_streams``: the streams the peer may open (a server's limit)."""
    h2speed.install()
    # Our own headers are well-formed by construction; everything received is checked.
    config = h2.config.H2Configuration(
        client_side=client_side, header_encoding=header_encoding,
        validate_outbound_headers=False, normalize_outbound_headers=False,
    )
    conn = h2.connection.H2Connection(config)
    settings = {
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_list_size,
        h2.settings.SettingCodes.MAX_FRAME_SIZE: max_frame_size,
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window,
        h2.settings.SettingCodes.ENABLE_PUSH: 0,
    }
    if max_concurrent_streams is not None:
        settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = max_concurrent_streams
    conn.local_settings = h2.settings.Settings(client=client_side, initial_values=settings)
    conn.decoder.max_header_list_size = max_header_list_size
    conn.max_inbound_frame_size = max_frame_size
    return conn
