"""Server start-up: the session image is prepared before serving, one server per state dir.

A stand-in ``build.py`` plays the image build here (the real one is exercised by every
suite that starts sandboxes), so these tests run no sandbox and take no minutes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import pytest

from deskbox_server.app import create_app
from deskbox_server.engines.image import build_image
from deskbox_server.errors import Internal
from deskbox_server.settings import Settings

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
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    images = tmp_path / "images-cache"
    images.mkdir()
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


def test_one_server_per_state_dir(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                        default_backend="local")
    with running_server(settings):
        second = create_app(settings).state.services.manager
        with pytest.raises(Internal, match="another Deskbox server"):
            asyncio.run(second.start())


def test_unknown_backends_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown backends"):
        create_app(Settings(state_dir=tmp_path, backends=["container", "firecracker"]))
    with pytest.raises(ValueError, match="default backend"):
        create_app(Settings(state_dir=tmp_path, backends=["local"]))
