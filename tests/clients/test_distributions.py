"""The two distributions as a user installs them: ``deskbox`` (the SDK and client CLI) from
its wheel alone, in a fresh venv, driving a real server; and ``deskbox-server`` declaring
the server and needing the client.

The wheels are built from a copy of the tree (a build writes ``build/`` and ``*.egg-info``
next to what it builds), both at once. The client's dependencies come from the package
index pip is configured with, through pip's cache: the file takes ~20 s when warm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest

from .conftest import KEY_A, Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
# Importable in a venv with the server; none may be in one with the client alone.
SERVER_MODULES = (
    "deskbox_server", "fastapi", "starlette", "uvicorn", "Xlib", "mss", "numpy", "simplejpeg",
    "PIL", "pydantic_settings",
)
_COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", ".state", "__pycache__", ".*_cache", ".hypothesis", "*.egg-info", "build",
    "dist", "results", ".peers", "node_modules",
)


@dataclass(frozen=True)
class Wheels:
    client: Path
    server: Path


def _metadata(wheel: Path) -> tuple[list[str], str]:
    """A wheel's Requires-Dist lines and its entry_points.txt."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(name for name in names if name.endswith(".dist-info/METADATA"))
        entry = next(name for name in names if name.endswith(".dist-info/entry_points.txt"))
        requires = Parser().parsestr(archive.read(meta).decode()).get_all("Requires-Dist") or []
        return requires, archive.read(entry).decode()


def _packages(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name.split("/")[0] for name in archive.namelist()
                if not name.split("/")[0].endswith(".dist-info")}


def _env() -> dict[str, str]:
    """No PYTHONPATH (the tests may run with the source tree on it) and no DESKBOX_*."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("DESKBOX_", "PYTHON")) or k == "PYTHONDONTWRITEBYTECODE"}


def _run(args: list[str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, f"{done.args}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    work = tmp_path_factory.mktemp("dists")
    source, out = work / "source", work / "wheels"
    # The whole tree (small without its caches): the server's pyproject may map package
    # data from anywhere in it.
    shutil.copytree(ROOT, source, ignore=_COPY_IGNORE)
    builds = [
        subprocess.Popen(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
            cwd=work, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for src in (source / "clients" / "python", source)
    ]
    for build in builds:
        _, err = build.communicate(timeout=300)
        assert build.returncode == 0, f"pip wheel {build.args[-1]} failed:\n{err[-3000:]}"
    (client,) = out.glob("deskbox-*.whl")
    (server,) = out.glob("deskbox_server-*.whl")
    return Wheels(client, server)


@pytest.fixture(scope="module")
def client_venv(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the client wheel and what it declares, nothing else."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], venv.parent))
    # This venv's pip installs into the other one: no pip inside it to bootstrap.
    _ok(_run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
              "install", "-q", str(wheels.client)], venv.parent, timeout=300))
    return venv


def test_each_wheel_holds_its_own_package(wheels: Wheels) -> None:
    assert _packages(wheels.client) == {"deskbox"}
    # The server ships the desktop's agent too: the local backend runs it on the host.
    assert _packages(wheels.server) == {"deskbox_server", "deskbox_agent"}
    with zipfile.ZipFile(wheels.server) as archive:
        names = archive.namelist()
    assert "deskbox_agent/__main__.py" in names
    assert "deskbox_server/engines/data/openbox-rc.xml" in names
    for wheel in (wheels.client, wheels.server):  # the licence travels with each
        with zipfile.ZipFile(wheel) as archive:
            assert any(name.endswith(".dist-info/licenses/LICENSE")
                       for name in archive.namelist()), wheel.name
    client_requires, client_entry = _metadata(wheels.client)
    server_requires, server_entry = _metadata(wheels.server)
    assert "deskbox = deskbox.cli:main" in client_entry
    assert "deskbox-server = deskbox_server.cli:main" in server_entry
    # The server needs the client of its own release (`deskbox serve` is mounted there).
    client_version = wheels.client.name.split("-")[1]
    assert f"deskbox=={client_version}" in server_requires
    assert wheels.server.name.split("-")[1] == client_version
    heavy = ("fastapi", "uvicorn", "python-xlib", "mss", "numpy", "simplejpeg", "pillow",
             "pydantic-settings", "mcp")
    core = [r for r in client_requires if "extra ==" not in r]
    assert not [r for r in core if r.split(">")[0].split("=")[0].split("<")[0] in heavy], core


def test_client_alone_has_none_of_the_server(client_venv: Path) -> None:
    probe = ("import importlib.util, importlib.metadata as m, sys\n"
             f"print(*[n for n in {SERVER_MODULES!r} if importlib.util.find_spec(n)])\n"
             "print(sorted(d.metadata['Name'].lower() for d in m.distributions()))")
    present, distributions = _ok(_run([str(client_venv / "bin" / "python"), "-c", probe],
                                      client_venv)).splitlines()
    assert present == "", f"server modules importable with the client alone: {present}"
    assert "'deskbox'" in distributions and "deskbox-server" not in distributions
    assert "'mcp'" not in distributions  # an extra: it brings starlette and uvicorn


def test_client_cli_and_sdk_drive_a_server(client_venv: Path, local_server: Server) -> None:
    deskbox, python = str(client_venv / "bin" / "deskbox"), str(client_venv / "bin" / "python")
    help_text = _ok(_run([deskbox, "--help"], client_venv))
    for command in ("create", "ls", "act", "screenshot", "serve", "mcp"):
        assert command in help_text

    # The SDK alone: a session made and screenshotted (PNG bytes, no Pillow needed); then
    # the CLI lists it and removes it, and the SDK sees it stopped.
    create = (
        "import sys\n"
        "from deskbox import Deskbox\n"
        "with Deskbox(sys.argv[1], sys.argv[2]) as box:\n"
        "    session = box.sessions.create(\n"
        "        backend='local', display={'width': 320, 'height': 240})\n"
        "    png = session.screenshot()\n"
        "    print(session.id, png[:8] == b'\\x89PNG\\r\\n\\x1a\\n')\n"
    )
    listed = (
        "import sys\n"
        "from deskbox import Deskbox\n"
        "with Deskbox(sys.argv[1], sys.argv[2]) as box:\n"
        "    print(*[f'{s.id}:{s.state}' for s in box.sessions.list()])\n"
    )
    where = [local_server.url, KEY_A]
    session_id, is_png = _ok(_run([python, "-c", create, *where], client_venv)).split()
    try:
        assert is_png == "True"
        assert f"{session_id}:running" in _ok(_run([python, "-c", listed, *where],
                                                  client_venv)).split()
        options = ["--url", local_server.url, "--api-key", KEY_A]
        shown = json.loads(_ok(_run([deskbox, "ls", "--json", *options], client_venv)))
        assert session_id in [item["id"] for item in shown], shown
        _ok(_run([deskbox, "rm", session_id, *options], client_venv))
        assert f"{session_id}:stopped" in _ok(_run([python, "-c", listed, *where],
                                                  client_venv)).split()
    finally:
        with local_server.client() as http:
            http.delete(f"/v1/sessions/{session_id}")


@pytest.mark.parametrize(("args", "install"), [
    (["serve", "--port", "0"], "pip install deskbox-server"),
    (["image", "verify"], "pip install deskbox-server"),
    (["mcp"], "pip install 'deskbox[mcp]'"),
])
def test_server_commands_name_what_to_install(
    client_venv: Path, args: list[str], install: str
) -> None:
    done = _run([str(client_venv / "bin" / "deskbox"), *args], client_venv, timeout=30)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert install in done.stderr and "Traceback" not in done.stderr
