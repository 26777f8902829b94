"""The session image for tests that start real sandboxes: one cache, found like the server.

``DESKBOX_IMAGE_STATE_DIR`` (the server's setting of that name) picks the cache. Tests
default to ``/var/cache/deskbox`` when it can be written (as root), so every checkout on a
machine shares one image and only the first run builds it (a few minutes); otherwise to
the repository's ``.state/``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from deskbox_server.engines.image import build_image
from deskbox_server.settings import default_recipe_dir

__all__ = ["IMAGE_STATE_DIR", "oci_image", "progress", "recipe_module", "session_image"]

REPO = Path(__file__).resolve().parents[1]
_SHARED_CACHE = Path("/var/cache/deskbox")
_DEFAULT_CACHE = _SHARED_CACHE if os.access(_SHARED_CACHE.parent, os.W_OK) else REPO / ".state"
IMAGE_STATE_DIR = Path(os.environ.get("DESKBOX_IMAGE_STATE_DIR", _DEFAULT_CACHE))


def progress(line: str) -> None:
    """A build's progress lines, on stderr as they come."""
    print(line, file=sys.stderr, flush=True)


def session_image() -> Path:
    """The current recipe's root filesystem; built (minutes, progress on stderr) if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress, timeout_s=1800)


def oci_image() -> Path:
    """The current recipe's OCI image directory (``images/oci-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress, timeout_s=1800,
                       script_name="oci_image.py")


@contextlib.contextmanager
def recipe_module(name: str) -> Iterator[ModuleType]:
    """``desktop_image/<name>.py`` as a module; it imports its siblings (build.py, ...) as
    top-level modules, so they are importable meanwhile and forgotten afterwards."""
    recipe = str(REPO / "desktop_image")
    sys.path.insert(0, recipe)
    try:
        yield importlib.import_module(name)
    finally:
        for module in (name, "build", "agent_install", "image_store"):
            sys.modules.pop(module, None)
        sys.path.remove(recipe)
