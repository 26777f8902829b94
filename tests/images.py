"""The session image for tests that start real sandboxes: one cache, found like the server.

``DESKBOX_IMAGE_STATE_DIR`` (the server's setting of that name) picks the cache; tests
default to the repository's ``.state/``, so every run after the first reuses one image.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deskbox_server.backends.image import build_image
from deskbox_server.settings import default_recipe_dir

__all__ = ["IMAGE_STATE_DIR", "session_image"]

REPO = Path(__file__).resolve().parents[1]
IMAGE_STATE_DIR = Path(os.environ.get("DESKBOX_IMAGE_STATE_DIR", REPO / ".state"))


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def session_image() -> Path:
    """The current recipe's root filesystem; built (minutes, progress on stderr) if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), _progress, timeout_s=1800)
