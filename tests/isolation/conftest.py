"""Real sandboxes (runc, the cached session image) for the isolation tests.

The image is built once if the cache has none (several minutes, progress on stderr) and
reused by every later run; sessions live in a temporary state directory of their own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox

from ..images import session_image
from ..sandbox_agent import agent_desktop, wait_ready

__all__ = ["agent_desktop", "wait_ready"]  # for the tests of this directory


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "isolation: starts real runc sandboxes from the session image (root, runc, mmdebstrap)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.isolation)
            item.add_marker(pytest.mark.slow)


def _build_image() -> Path:
    return session_image()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the image (minutes, once) before any test runs, outside every test's timeout."""
    here = Path(__file__).parent
    if any(here in Path(str(item.fspath)).parents for item in session.items):
        _build_image()


@pytest.fixture(scope="session")
def image_rootfs() -> Path:
    """The session root filesystem of the current recipe (cached by now)."""
    return _build_image()


@pytest.fixture(scope="session")
def runc() -> Runc:
    return Runc()


@pytest.fixture(scope="session")
def options(
    image_rootfs: Path, runc: Runc, tmp_path_factory: pytest.TempPathFactory
) -> RuncOptions:
    return RuncOptions(
        state_dir=tmp_path_factory.mktemp("state"), rootfs=image_rootfs, runc=runc,
    )


@pytest.fixture(scope="module")
def sandbox(
    options: RuncOptions, request: pytest.FixtureRequest
) -> Iterator[RuncSandbox]:
    """One running sandbox with a browser for a whole test module."""
    name = request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")
    box = RuncSandbox.start(options, f"t-{name}-{os.getpid()}")
    try:
        asyncio.run(wait_ready(box))
        yield box
    finally:
        box.destroy()


def exec_in(
    sandbox: RuncSandbox, *argv: str, timeout_s: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside the sandbox as its processes run (same caps, seccomp, user)."""
    return subprocess.run(
        [*sandbox.options.runc.command(), "exec", sandbox.container_id, *argv],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
        check=False,
    )

