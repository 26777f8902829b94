"""deskbox-agent: the desktop's own server inside every Deskbox sandbox.

It serves the control plane over one bidirectional byte stream that speaks HTTP/2 with
prior knowledge (``../PROTOCOL.md``). It runs under the image's python3 with the standard
library and ``h2`` only, holds no secret and needs no capability: everything it does, the
sandbox's own processes can do already.
"""

from __future__ import annotations

__all__ = ["PROTOCOL", "VERSION"]

VERSION = "0.1.0"
PROTOCOL = 1  # bumped on any change a peer of the other version would misread
