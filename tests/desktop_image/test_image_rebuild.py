"""A cached image that fails its integrity check is built again by the command its error
names, which replaces it: unmounted, removed, the new one mounted in its place.

The error advised removing the image directory, which cannot be done (its rootfs/ is a
read-only mount), and the build then renamed its result onto what was left: ENOTEMPTY.
A tiny recipe stands in for the real one here: its base (mmdebstrap's stage) is a small
tree made by the test and the agent's install is left out; the erofs image, its mount and
its check are real (root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SESSION = b"#!/usr/bin/python3\nprint('the session')\n"
DESKBOX = str(Path(sys.executable).parent / "deskbox")


def mounts_under(directory: Path) -> list[str]:
    top = str(directory.resolve())
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(top + "/")]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """The image cache; whatever is mounted in it is unmounted afterwards."""
    state = tmp_path / "state"
    yield state
    for point in sorted(mounts_under(state), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


@pytest.fixture
def recipe(build: ModuleType, state: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A tiny recipe, what build.py's main() builds meanwhile; its base is built already."""
    recipe = build.Recipe(packages=("python3",), script=b"a tiny recipe",
                          overlay=(("usr/local/bin/deskbox-session", SESSION, 0o755),))
    base = state / "images" / f"base-{recipe.base_hash}" / "rootfs"
    (base / "var/lib/dpkg").mkdir(parents=True)
    (base / "var/lib/dpkg/status").write_text(
        "Package: python3\nStatus: install ok installed\nVersion: 3.11.2-1+b1\n")
    (base / "etc").mkdir()
    (base / "etc/hostname").write_text("deskbox\n")
    monkeypatch.setattr(build, "load_recipe", lambda *_: recipe)
    monkeypatch.setattr(build, "_install_agent", lambda *_: {"wheels": []})
    sigterm = signal.getsignal(signal.SIGTERM)  # main() makes SIGTERM a KeyboardInterrupt
    yield recipe
    signal.signal(signal.SIGTERM, sigterm)


def tamper(build: ModuleType, image_dir: Path, tmp_path: Path) -> None:
    """Replace the image file with one of other contents; its manifests stay."""
    evil = tmp_path / "evil"
    (evil / "usr/local/bin").mkdir(parents=True)
    (evil / "usr/local/bin/deskbox-session").write_text("#!/bin/sh\nevil\n")
    image = image_dir / build.image_store.IMAGE_FILE
    image.chmod(0o644)
    image.unlink()
    build.image_store.make_image(evil, image)


def made_from(image_dir: Path, image_hash: str) -> Path:
    """An OCI image directory as oci_image.py leaves it, made from ``image_hash``."""
    directory = image_dir.parent / f"oci-made-from-{image_hash}"
    directory.mkdir()
    (directory / "manifest.json").write_text(json.dumps({"image_hash": image_hash}))
    return directory


def test_the_command_the_error_names_replaces_the_image(
    build: ModuleType, recipe: Any, state: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image_dir = state / "images" / recipe.hash
    assert build.main(["--state-dir", str(state)]) == 0
    copied = made_from(image_dir, recipe.hash)  # a copy of the files about to be tampered with
    other = made_from(image_dir, "0123456789abcdef")
    tamper(build, image_dir, tmp_path)
    capsys.readouterr()

    assert build.main(["--state-dir", str(state)]) == build.INTEGRITY_FAILED
    error = capsys.readouterr().err
    assert "modified after it was built" in error
    # What `deskbox image build` runs with that option, once its --state-dir is passed on.
    assert f"`deskbox image build --state-dir {state} --rebuild`" in error
    assert build.main(["--state-dir", str(state), "--rebuild"]) == 0

    rootfs = Path(capsys.readouterr().out.splitlines()[-1])
    assert rootfs == image_dir / "rootfs"
    assert (rootfs / "usr/local/bin/deskbox-session").read_bytes() == SESSION
    assert build.image_store.verify(image_dir) == []
    assert mounts_under(state) == [str(rootfs)]  # the tampered image's mount is gone
    assert not copied.exists() and other.is_dir()
    assert sorted(path.name for path in (state / "images").iterdir() if path.is_dir()) == [
        recipe.hash, f"base-{recipe.base_hash}", other.name]


def test_what_a_removal_by_hand_left_does_not_stop_the_next_build(
    build: ModuleType, recipe: Any, state: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image_dir = state / "images" / recipe.hash
    assert build.main(["--state-dir", str(state)]) == 0
    tamper(build, image_dir, tmp_path)
    removed = subprocess.run(["rm", "-rf", str(image_dir)], capture_output=True, text=True)
    assert "Read-only file system" in removed.stderr  # its mounted rootfs/ stays
    capsys.readouterr()
    assert build.main(["--state-dir", str(state)]) == 0
    assert build.image_store.verify(image_dir) == []
    assert mounts_under(state) == [str(image_dir / "rootfs")]


FAKE_BUILD = """
import pathlib, sys
state = pathlib.Path(sys.argv[sys.argv.index("--state-dir") + 1])
(state / "argv").write_text(" ".join(sys.argv[1:]))
rootfs = state / "images" / "fake" / "rootfs"
rootfs.mkdir(parents=True, exist_ok=True)
print(rootfs)
"""


def test_deskbox_image_build_takes_the_rebuild_option(tmp_path: Path) -> None:
    recipe_dir = tmp_path / "recipe"
    recipe_dir.mkdir()
    (recipe_dir / "build.py").write_text(FAKE_BUILD)
    done = subprocess.run(
        [DESKBOX, "image", "build", "--state-dir", str(tmp_path), "--rebuild"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "DESKBOX_RECIPE_DIR": str(recipe_dir)},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "argv").read_text() == f"--state-dir {tmp_path} --rebuild"
    assert done.stdout.strip() == str(tmp_path / "images" / "fake")
