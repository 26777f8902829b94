"""The session image for tests that start real sandboxes: one cache, found like the server.

``DESKBOX_IMAGE_STATE_DIR`` (the server's setting of that name) picks the cache. Tests
default to ``/var/cache/deskbox`` when it can be written (as root), so every checkout on a
machine shares one image and only the first run builds it (a few minutes); otherwise to
the repository's ``.state/``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deskbox_server.engines.image import build_image
from deskbox_server.settings import default_recipe_dir

__all__ = ["IMAGE_STATE_DIR", "session_image"]

REPO = Path(__file__).resolve().parents[1]
_SHARED_CACHE = Path("/var/cache/deskbox")
_DEFAULT_CACHE = _SHARED_CACHE if os.access(_SHARED_CACHE.parent, os.W_OK) else REPO / ".state"
IMAGE_STATE_DIR = Path(os.environ.get("DESKBOX_IMAGE_STATE_DIR", _DEFAULT_CACHE))


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def session_image() -> Path:
    """The current recipe's root filesystem; built (minutes, progress on stderr) if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), _progress, timeout_s=1800)
