"""Real servers for the client tests: a local-backend one for speed, shared by the suite.

The container backend (exec and files) runs on a server of its own in ``test_sdk_container``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from deskbox_server.settings import Settings

from ..api.conftest import KEY_A, KEY_B, Server, running_server

__all__ = ["KEY_A", "KEY_B", "Server"]


@pytest.fixture(scope="session")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("client-state"),
        api_keys=[KEY_A, KEY_B],
        backends=["local"],
        default_backend="local",
        reaper_interval_s=0.2,
        max_sessions=6,
        max_sessions_per_key=4,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture(scope="session")
def one_per_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that lets a key hold one session, and says to try again after 1 s."""
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("one-per-key-state"), api_keys=[KEY_A],
        backends=["local"], default_backend="local", reaper_interval_s=0.2,
        max_sessions_per_key=1, retry_after_s=1,
    )
    with running_server(settings) as running:
        yield running
