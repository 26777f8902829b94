"""The docker engine's tests run against a real Engine API: Debian's Podman as the
compatible service (podman.py), started once for the package; its containers and storage go
at the end. No Docker daemon runs on these machines.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.image import build_image
from deskbox_server.settings import default_recipe_dir

from ..images import IMAGE_STATE_DIR, progress
from .podman import Podman, podman_service


def oci_image() -> Path:
    """The current recipe's OCI image directory (``images/oci-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress, timeout_s=1800,
                       script_name="oci_image.py")


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        oci_image()


@pytest.fixture(scope="package")
def podman() -> Iterator[Podman]:
    with podman_service() as service:
        yield service
