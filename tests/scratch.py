"""Scratch directories of the suites that start their own servers."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

__all__ = ["scratch_dir"]


def scratch_dir(request: pytest.FixtureRequest, prefix: str) -> Path:
    """A new directory under /tmp (a short path: unix sockets are made below it), removed
    when ``request``'s fixture ends, unless a test failed meanwhile: then the servers' logs
    in it stay to tell the story."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    failed_before = request.session.testsfailed

    def remove() -> None:
        if request.session.testsfailed != failed_before:
            return
        # Never through a mount left below it: the suite's own check reports that.
        mounts = Path("/proc/self/mounts").read_text().split("\n")
        if any(f" {path}/" in line for line in mounts):
            return
        shutil.rmtree(path, ignore_errors=True)

    request.addfinalizer(remove)
    return path
