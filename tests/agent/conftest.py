"""The real agent (a subprocess on a unix socket in tmp) and clients connected to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from deskbox_server.agent import AgentClient, AgentLimits
from deskbox_server.agent.desktop import AgentDesktop

from ..cdp_page import CdpPage
from ..images import IMAGE_STATE_DIR
from ..local_desktop import HostDesktop
from .desk_page import Page

AGENT_DIR = Path(__file__).resolve().parents[2] / "desktop_image" / "agent"

# Calls that only tests register: a blob of a given size (the latency figures use it).
BLOB_AGENT = """
import sys
from deskbox_agent import __main__ as m
from deskbox_agent.registry import Blob

registry = m.default_registry()

async def blob(args):
    return Blob(b"\\x5a" * int(args.get("size", 0)), "image/jpeg")

async def boom(args):
    raise RuntimeError("a handler bug")

async def sleep(args):
    import asyncio
    await asyncio.sleep(float(args.get("s", 0)))
    return {}

registry.register("blob", blob)
registry.register("boom", boom)
registry.register("sleep", sleep)
m.default_registry = lambda: registry
sys.exit(m.main(sys.argv[1:]))
"""


def agent_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(AGENT_DIR)}


def start_agent(socket_path: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOB_AGENT, "--listen", f"unix:{socket_path}"],
        env=agent_env(), stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(socket_path))
                return proc
            except OSError:
                pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the agent did not start: {proc.communicate()[1]!r}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def agent_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("agent") / "agent.sock"
    proc = start_agent(path)
    yield path
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stderr is not None
    proc.stderr.close()


@pytest_asyncio.fixture(loop_scope="function")  # the tests' own loop runs the reader task
async def client(agent_socket: Path) -> AsyncIterator[AgentClient]:
    c = await AgentClient.connect_unix(str(agent_socket), AgentLimits())
    try:
        yield c
    finally:
        await c.close()


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


WHEEL_CACHE = IMAGE_STATE_DIR / "wheels"  # where the image build keeps the agent's wheels


@pytest.fixture(scope="session")
def agent_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent's pinned wheels (requirements.txt, hash-checked), installed as the image
    installs them, so that the agent runs with exactly its own dependencies (isal, ...)."""
    requirements = AGENT_DIR / "requirements.txt"
    target = tmp_path_factory.mktemp("agent-site")
    install = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input",
               "install", "--target", str(target), "--require-hashes", "--no-compile",
               "--only-binary=:all:", "--requirement", str(requirements)]
    done = subprocess.run([*install, "--no-index", "--find-links", str(WHEEL_CACHE)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:  # not cached yet: the image build would download them too
        done = subprocess.run(install, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"cannot install the agent's wheels: {done.stderr[-2000:]}"
    return target


def start_desktop_agent(socket_path: Path, display: str, site: Path,
                        ) -> subprocess.Popen[bytes]:
    """The real agent, ``python -m deskbox_agent``, driving ``display``."""
    env = {**os.environ, "PYTHONPATH": f"{AGENT_DIR}{os.pathsep}{site}"}
    env.pop("DISPLAY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "deskbox_agent", "--listen", f"unix:{socket_path}",
         "--display", display], env=env, stderr=subprocess.PIPE,
    )
    _wait_listening(proc, socket_path)
    return proc


def _wait_listening(proc: subprocess.Popen[bytes], socket_path: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(socket_path))
                return
            except OSError:
                pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the agent did not start: {proc.communicate()[1]!r}")
        time.sleep(0.01)


@contextlib.contextmanager
def scripted_agent(script: str, mode: str, socket_path: Path) -> Iterator[Path]:
    """An agent whose calls ``script`` (a program run with ``python -c``) replaces, as a
    hostile one would answer: ``mode`` (HOSTILE_MODE) picks how."""
    env = {**os.environ, "PYTHONPATH": str(AGENT_DIR), "HOSTILE_MODE": mode}
    env.pop("DISPLAY", None)
    proc = subprocess.Popen([sys.executable, "-c", script, "--listen", f"unix:{socket_path}"],
                            env=env, stderr=subprocess.PIPE)
    try:
        _wait_listening(proc, socket_path)
        yield socket_path
    finally:
        stop_agent(proc)


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


# -- the event page on a desktop of host processes, driven by the real agent (desk_page.py)


@pytest.fixture(scope="module")
def host_desktop() -> Iterator[HostDesktop]:
    with HostDesktop() as desktop:
        yield desktop


@pytest.fixture(scope="module")
def desk_socket(host_desktop: HostDesktop, agent_site: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("desk") / "agent.sock"
    proc = start_desktop_agent(path, host_desktop.display_name, agent_site)
    yield path
    stop_agent(proc)


@pytest.fixture(scope="module")
def cdp(host_desktop: HostDesktop) -> Iterator[CdpPage]:
    with CdpPage.first(host_desktop.devtools_url) as page:
        yield page


@pytest_asyncio.fixture(loop_scope="function")
async def desk(desk_socket: Path) -> AsyncIterator[AgentDesktop]:
    client = await AgentClient.connect_unix(str(desk_socket))
    try:
        yield AgentDesktop(client)
    finally:
        await client.close()


@pytest_asyncio.fixture(loop_scope="function")
async def page(desk: AgentDesktop, cdp: CdpPage) -> Page:
    p = Page(desk, cdp)
    await p.load()
    return p
