"""The runnable examples under clients/python/examples run against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import KEY_A, Server

EXAMPLES = Path(__file__).parents[2] / "clients" / "python" / "examples"


@pytest.mark.parametrize("name", ["quickstart.py", "async_loop.py"])
def test_example_runs(local_server: Server, name: str, tmp_path: Path) -> None:
    env = {**os.environ, "DESKBOX_URL": local_server.url, "DESKBOX_API_KEY": KEY_A}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout
