"""The docker engine's tests run against a real Engine API: Debian's Podman as the
compatible service (podman.py, the suite's ``podman`` fixture in tests/conftest.py). No
Docker daemon runs on these machines.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..images import oci_image


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        oci_image()
