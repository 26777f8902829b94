"""What the tests of checkpoints share: a runc sandbox without a browser."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox

from ..images import session_image
from ..sandbox_agent import until_ready


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[RuncSandbox]:
    """Xvfb, openbox and the agent in a runc sandbox, ready, with no connection of ours
    left into it (CRIU cannot dump one)."""
    options = RuncOptions(state_dir=tmp_path / "state", rootfs=session_image(),
                          id_prefix="deskbox-ckpt-")
    box = RuncSandbox.start(options, f"c{os.getpid()}", browser=False)
    try:
        yield until_ready(box, browser=False)
    finally:
        box.destroy()
