"""A container-backend server for the task tests (exec, files and DevTools are needed), and
the example tasks of the repository's ``tasks/``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from deskbox import Deskbox
from deskbox.tasks import Task, load_callable

from ..api.conftest import KEY_A, Server
from ..api.containers import container_server
from ..images import session_image

TASKS_DIR = Path(__file__).resolve().parents[2] / "tasks"
EXAMPLE_TASKS = sorted(TASKS_DIR.glob("*.yaml"))


def example(name: str) -> Task:
    return Task.load(TASKS_DIR / f"{name}.yaml")


def solver(name: str) -> Callable[..., Any]:
    """``solve``, ``noop``, ... of tasks/solvers.py, loaded as ``deskbox eval`` loads it."""
    return load_callable(f"solvers.py:{name}", TASKS_DIR)


@pytest.fixture(scope="package")
def task_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()
    with container_server(tmp_path_factory, "tasks") as running:
        yield running


@pytest.fixture
def box(task_server: Server) -> Iterator[Deskbox]:
    with Deskbox(task_server.url, KEY_A) as client:
        yield client


def live_sessions(box: Deskbox) -> list[str]:
    return [s.id for s in box.sessions.list() if s.state not in ("stopped", "failed")]
