"""Server start-up: the session image is prepared before serving, one server per state dir.

A stand-in ``build.py`` plays the image build here (the real one is exercised by every
suite that starts sandboxes), so these tests take no minutes; one starts a real session,
from the image cache a server uses by default (built by the suites before it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.app import create_app
from deskbox_server.engines.image import build_image
from deskbox_server.engines.runc.reach import closed_directory
from deskbox_server.errors import Internal, InvalidSetting
from deskbox_server.settings import ROOT_IMAGE_CACHE, Settings, default_recipe_dir

from ..images import progress
from .conftest import KEY_A, running_server

FAKE_BUILD = """
import argparse, pathlib, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--state-dir", type=pathlib.Path)
args = parser.parse_args()
mode = (pathlib.Path(__file__).parent / "mode").read_text().strip()
(args.state_dir / "build-ran").write_text("yes")
print("step 1: resolving packages", file=sys.stderr, flush=True)
if mode == "fail":
    print("boom: no network", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    time.sleep(60)
rootfs = args.state_dir / "images" / "fake" / "rootfs"
rootfs.mkdir(parents=True, exist_ok=True)
print("step 2: done", file=sys.stderr, flush=True)
print("noise on stdout")
print(rootfs)
"""


def fake_recipe(tmp_path: Path, mode: str = "ok") -> Path:
    recipe = tmp_path / "recipe"
    recipe.mkdir(exist_ok=True)
    (recipe / "build.py").write_text(FAKE_BUILD)
    (recipe / "mode").write_text(mode)
    return recipe


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may pass through, as an image cache must be (pytest's own
    temporary directories are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="deskbox-open-"))
    path.chmod(0o755)
    assert closed_directory(path) is None
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_build_relays_progress_and_returns_the_rootfs(tmp_path: Path) -> None:
    lines: list[str] = []
    rootfs = build_image(tmp_path, fake_recipe(tmp_path), lines.append)
    assert rootfs == tmp_path / "images" / "fake" / "rootfs" and rootfs.is_dir()
    assert lines == ["step 1: resolving packages", "step 2: done"]


def test_a_failed_build_says_why(tmp_path: Path) -> None:
    with pytest.raises(Internal, match="boom: no network"):
        build_image(tmp_path, fake_recipe(tmp_path, "fail"), lambda _: None)
    with pytest.raises(Internal, match="recipe"):
        build_image(tmp_path, tmp_path / "nowhere", lambda _: None)


def test_a_build_can_be_cancelled(tmp_path: Path) -> None:
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    with pytest.raises(Internal, match="cancelled"):
        build_image(tmp_path, fake_recipe(tmp_path, "hang"), lambda _: None, cancel=cancel)
    assert time.monotonic() - started < 10


def test_the_server_prepares_the_image_before_serving(
    tmp_path: Path, open_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    images = open_dir
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A],
                        recipe_dir=fake_recipe(tmp_path), image_state_dir=images)
    assert settings.default_backend == "container"
    create_app(settings)
    assert not (images / "build-ran").exists()  # nothing heavy in create_app
    with caplog.at_level(logging.INFO, logger="deskbox.image"), running_server(settings):
        assert (images / "build-ran").exists()
        progress = [r.getMessage() for r in caplog.records if r.name == "deskbox.image"]
        assert "step 1: resolving packages" in progress and "step 2: done" in progress


def test_a_server_that_cannot_build_its_image_does_not_serve(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A],
                        recipe_dir=fake_recipe(tmp_path, "fail"), image_state_dir=tmp_path)
    manager = create_app(settings).state.services.manager
    with pytest.raises(Internal, match="boom"):
        asyncio.run(manager.start())
    # It let go of the state dir: a fixed server can start on it.
    fixed = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                     default_backend="local")
    with running_server(fixed):
        pass


@pytest.mark.slow
def test_the_default_image_cache_serves_sessions_whose_state_is_closed_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `make run` does as root: the state dir in root's home, closed to other users, and
    no image cache set. A sandbox's root is an unprivileged user of the host: its session
    starts only because the image is not under the state dir."""
    monkeypatch.delenv("DESKBOX_IMAGE_STATE_DIR", raising=False)
    state_dir = tmp_path / "state"
    assert closed_directory(tmp_path) is not None  # pytest's directories are 0700
    settings = Settings(state_dir=state_dir, api_keys=[KEY_A])
    assert os.geteuid() == 0 and settings.image_cache_dir == ROOT_IMAGE_CACHE
    build_image(ROOT_IMAGE_CACHE, default_recipe_dir(), progress, timeout_s=1800)  # cached
    with running_server(settings) as server, server.client() as client:
        created = client.post("/v1/sessions", json={})
        assert created.status_code == 201, created.text
        assert created.json()["state"] == "running"
        shot = client.get(f"/v1/sessions/{created.json()['id']}/screenshot?format=png")
        assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")
        assert client.delete(f"/v1/sessions/{created.json()['id']}").status_code == 204


def test_a_server_whose_sandboxes_cannot_reach_its_image_does_not_serve(
    tmp_path: Path,
) -> None:
    """An image cache set under a directory closed to other users: every session would fail
    at its start with runc's "permission denied"; the server says what to change instead."""
    cache = tmp_path / "cache"
    cache.mkdir()
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A],
                        recipe_dir=fake_recipe(tmp_path), image_state_dir=cache)
    manager = create_app(settings).state.services.manager
    with pytest.raises(Internal, match="sandboxes cannot reach the session image") as refused:
        asyncio.run(manager.start())
    closed = closed_directory(cache)
    assert closed is not None and closed in (tmp_path, *tmp_path.parents)
    assert f"{closed} (mode 0700)" in refused.value.message
    assert "DESKBOX_IMAGE_STATE_DIR" in refused.value.message
    assert f"chmod o+x {closed}" in refused.value.message


def test_closed_directory_follows_links(tmp_path: Path, open_dir: Path) -> None:
    inside = open_dir / "a" / "b"
    inside.mkdir(parents=True)
    assert closed_directory(inside) is None
    (open_dir / "a").chmod(0o750)
    assert closed_directory(inside) == open_dir / "a"
    link = open_dir / "link"
    link.symlink_to(tmp_path)
    assert closed_directory(link) is not None and closed_directory(link) != link
    with pytest.raises(FileNotFoundError):
        closed_directory(open_dir / "missing")


def test_one_server_per_state_dir(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                        default_backend="local")
    with running_server(settings):
        second = create_app(settings).state.services.manager
        with pytest.raises(Internal, match="another Deskbox server"):
            asyncio.run(second.start())


def test_unknown_backends_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidSetting, match="unknown backends firecracker"):
        create_app(Settings(state_dir=tmp_path, backends=["container", "firecracker"]))
    with pytest.raises(InvalidSetting, match="default backend"):
        create_app(Settings(state_dir=tmp_path, backends=["local"]))
