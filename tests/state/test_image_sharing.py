"""CRIU's images are shared with the sandbox's gid once per tree (engines/runc/criu.py):
a fork shares them after its dump, and its copies, restored at once, find them shared."""

from __future__ import annotations

import os
from pathlib import Path

from deskbox_server.engines.runc.criu import share_images
from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS

GID = SANDBOX_USER_IDS[0]  # the sandboxes' gid 0 on the host


def _tree(root: Path) -> Path:
    images = root / "images"
    (images / "sub").mkdir(parents=True, mode=0o700)
    for path in (images / "pages-1.img", images / "sub" / "tmpfs-dev-1.tar.gz.img"):
        path.write_bytes(b"x")
        path.chmod(0o600)
    return images


def test_every_file_and_directory_becomes_readable_by_the_gid(tmp_path: Path) -> None:
    images = _tree(tmp_path)
    share_images(images, GID)
    for directory, _, files in os.walk(images):
        assert (os.stat(directory).st_gid, os.stat(directory).st_mode & 0o777) == (GID, 0o750)
        for name in files:
            info = os.stat(os.path.join(directory, name))
            assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, GID, 0o640)


def test_a_shared_tree_is_left_as_it_is(tmp_path: Path) -> None:
    images = _tree(tmp_path)
    share_images(images, GID)
    (images / "pages-1.img").chmod(0o600)  # would be undone by a second pass
    share_images(images, GID)
    assert (images / "pages-1.img").stat().st_mode & 0o777 == 0o600


def test_a_tree_shared_halfway_is_shared_again(tmp_path: Path) -> None:
    images = _tree(tmp_path)
    share_images(images, GID)
    (images / "pages-1.img").chmod(0o600)
    images.chmod(0o700)  # the top directory is done last: this pass did not finish
    share_images(images, GID)
    assert (images / "pages-1.img").stat().st_mode & 0o777 == 0o640
    assert images.stat().st_mode & 0o777 == 0o750
