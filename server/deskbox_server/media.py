"""Frames (raw BGRX pixels) and their encoding to JPEG, PNG and WebP: the images that pass
between a desktop, the session layer and the API, whichever of them made the image.

They are the desktop agent's own types and encoder (deskbox_agent.desktop.frame and
.encode: numpy, libjpeg-turbo, ISA-L, Pillow; no X library), so an image the host makes
(a paused session's last frame, encoded again at another size or format) is byte for
byte what the agent would have sent.
"""

from __future__ import annotations

from deskbox_agent.desktop.encode import MEDIA_TYPES, EncodedImage, encode
from deskbox_agent.desktop.frame import Frame

__all__ = ["MEDIA_TYPES", "EncodedImage", "Frame", "encode"]
