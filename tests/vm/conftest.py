"""VM sessions: the guest is built (minutes, once: kernel, initramfs, beside the shared
session image) before any test's deadline starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskbox_server.engines.image import build_image
from deskbox_server.settings import default_recipe_dir

from ..images import IMAGE_STATE_DIR, _progress


def vm_guest() -> Path:
    """The current recipe's VM guest directory (``images/vm-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), _progress, timeout_s=1800,
                       script_name="vm_guest.py")


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        vm_guest()
