"""The runnable examples under clients/python/examples run against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import KEY_A, Server

EXAMPLES = Path(__file__).parents[2] / "clients" / "python" / "examples"


# The agent examples call a vendor's model only when its API key is set: the tests unset
# it, so they run their scripted stand-in (no network, no key needed).
VENDOR_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")


@pytest.mark.parametrize(
    "name", ["quickstart.py", "async_loop.py", "claude_agent.py", "openai_agent.py"])
def test_example_runs(local_server: Server, name: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in VENDOR_KEYS}
    env |= {"DESKBOX_URL": local_server.url, "DESKBOX_API_KEY": KEY_A}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout
    if name.endswith("_agent.py"):
        assert "done after 4 steps" in done.stdout, done.stdout
        assert "True" not in done.stdout  # no tool call failed
