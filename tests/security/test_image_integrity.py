"""Issue 13, part 1, image integrity: the session image keeps a content manifest written at
build time; every start checks it cheaply and a server refuses to serve from an image that
fails; `deskbox image verify` compares every byte.

Small real erofs images stand in for the session image here (the real one is checked by
every suite that starts sandboxes, and verified whole by test_restored_root.py).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deskbox_server.app import create_app
from deskbox_server.errors import Internal
from deskbox_server.settings import Settings, default_recipe_dir
from desktop_image import image_store

from ..api.conftest import KEY_A


def recipe_hash() -> str:
    done = subprocess.run(
        ["python3", str(default_recipe_dir() / "build.py"), "--print-hash"],
        capture_output=True, text=True, check=True,
    )
    return done.stdout.strip()


def build_tiny_image(image_dir: Path, tree: Path) -> None:
    """What build.py writes, for a small tree: the erofs file and both manifests."""
    image_dir.mkdir(parents=True)
    image_store.write_contents(tree, image_dir / image_store.CONTENTS)
    image_store.make_image(tree, image_dir / image_store.IMAGE_FILE)
    manifest = {"hash": image_dir.name,
                "image": image_store.image_record(image_dir / image_store.IMAGE_FILE)}
    (image_dir / image_store.MANIFEST).write_text(json.dumps(manifest))


def make_tree(root: Path, launcher: bytes = b"#!/usr/bin/python3\nprint('hi')\n") -> Path:
    for relative in image_store.CRITICAL_FILES:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(f"contents of {relative}\n".encode())
    (root / "usr/local/bin/deskbox-session").write_bytes(launcher)
    (root / "etc/hostname").write_text("deskbox\n")
    (root / "usr/bin/python3").symlink_to("python3.11")
    return root


def repack(image_dir: Path, tree: Path) -> None:
    """Replace the image file with one made from ``tree``; the manifests stay."""
    image = image_dir / image_store.IMAGE_FILE
    image.chmod(0o644)
    image.unlink()
    image_store.make_image(tree, image)


@pytest.fixture
def unmount_after(tmp_path: Path) -> Iterator[list[Path]]:
    mounted: list[Path] = []
    yield mounted
    for image_dir in mounted:
        subprocess.run(["umount", str(image_dir / image_store.MOUNTPOINT)], check=False)


def test_an_intact_image_passes_and_is_mounted_read_only(
    tmp_path: Path, unmount_after: list[Path]
) -> None:
    image_dir = tmp_path / "images" / "h1"
    build_tiny_image(image_dir, make_tree(tmp_path / "tree"))
    unmount_after.append(image_dir)
    mountpoint = image_store.check(image_dir)
    assert image_store.mounted_fstype(mountpoint) == ("erofs", True)
    assert (mountpoint / "etc/hostname").read_text() == "deskbox\n"
    with pytest.raises(OSError, match="Read-only file system"):
        (mountpoint / "etc/hostname").write_text("evil\n")
    assert image_store.verify(image_dir) == []


def _check_at(barrier: Any, image_dir: Path, answers: Any) -> None:
    barrier.wait()
    try:
        image_store.check(image_dir)
        answers.put("mounted")
    except Exception as error:  # noqa: BLE001 (what failed is the answer)
        answers.put(repr(error))


def test_processes_that_find_an_image_unmounted_at_once_all_get_it_mounted(
    tmp_path: Path, unmount_after: list[Path]
) -> None:
    """Two servers (or two test workers) starting together both found the image unmounted
    and both mounted it: the second mount failed ("already mounted or mount point busy")
    and so did its server's start. One mounts now, the others wait and find its mount."""
    image_dir = tmp_path / "images" / "h0"
    build_tiny_image(image_dir, make_tree(tmp_path / "tree"))
    unmount_after.append(image_dir)
    context = multiprocessing.get_context("fork")
    barrier, answers = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_check_at, args=(barrier, image_dir, answers))
                 for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert sorted(answers.get(timeout=5) for _ in processes) == ["mounted"] * 4
    mountpoint = str((image_dir / image_store.MOUNTPOINT).resolve())
    assert [point for point, _ in image_store.mount_table() if point == mountpoint] == [
        mountpoint]


def test_a_replaced_image_file_is_refused(tmp_path: Path, unmount_after: list[Path]) -> None:
    image_dir = tmp_path / "images" / "h2"
    build_tiny_image(image_dir, make_tree(tmp_path / "tree"))
    repack(image_dir, make_tree(tmp_path / "evil", b"#!/bin/sh\nevil\n"))
    with pytest.raises(image_store.ImageIntegrityError, match="modified after it was built"):
        image_store.check(image_dir)


def test_a_changed_program_is_refused_even_with_a_rewritten_image_record(
    tmp_path: Path, unmount_after: list[Path]
) -> None:
    """Someone who rewrote the image and its record still differs from the contents."""
    image_dir = tmp_path / "images" / "h3"
    build_tiny_image(image_dir, make_tree(tmp_path / "tree"))
    evil = make_tree(tmp_path / "evil", b"#!/bin/sh\nevil\n")
    (evil / "usr/bin/extra").write_text("planted\n")
    repack(image_dir, evil)
    manifest = json.loads((image_dir / image_store.MANIFEST).read_text())
    manifest["image"] = image_store.image_record(image_dir / image_store.IMAGE_FILE)
    (image_dir / image_store.MANIFEST).write_text(json.dumps(manifest))
    unmount_after.append(image_dir)
    with pytest.raises(image_store.ImageIntegrityError,
                       match="usr/local/bin/deskbox-session: size"):
        image_store.check(image_dir)
    problems = {str(problem) for problem in image_store.verify(image_dir)}
    assert "usr/bin/extra: not in the build" in problems
    assert any(p.startswith("usr/local/bin/deskbox-session: size") for p in problems)


def test_a_server_refuses_to_serve_from_a_tampered_image(
    tmp_path: Path, unmount_after: list[Path]
) -> None:
    cache = tmp_path / "cache"
    image_dir = cache / "images" / recipe_hash()
    build_tiny_image(image_dir, make_tree(tmp_path / "tree"))
    repack(image_dir, make_tree(tmp_path / "evil", b"#!/bin/sh\nevil\n"))
    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], image_state_dir=cache)
    manager = create_app(settings).state.services.manager
    with pytest.raises(Internal, match="failed its integrity check") as refused:
        asyncio.run(manager.start())
    assert "modified after it was built" in refused.value.message
    assert image_store.mounted_fstype(image_dir / image_store.MOUNTPOINT) is None
