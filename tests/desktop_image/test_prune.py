"""`deskbox image prune` (desktop_image/prune.py): every image of the cache but the current
recipe's is unmounted and removed, with what was made from it, unless something uses it.

Each recipe change left a whole image (GBs) and its loop mount behind, for good. Small real
erofs images stand in for the session images here (mounted, as a server mounts them); a
sandbox is a process chrooted into one from a mount namespace of its own (as runc's are,
where unmounting on the host is not refused), a VM's QEMU a process holding the image
file open through the guest's link.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from ..api.served import serve
from ..images import IMAGE_STATE_DIR, recipe_module

DESKBOX = str(Path(sys.executable).parent / "deskbox")
MiB = 2**20


@pytest.fixture(scope="module")
def prune() -> Iterator[ModuleType]:
    with recipe_module("prune") as module:
        yield module


@pytest.fixture
def images(tmp_path: Path) -> Iterator[Path]:
    """The cache's images/; whatever is mounted in it is unmounted afterwards."""
    images = tmp_path / "state" / "images"
    images.mkdir(parents=True)
    yield images
    for point in sorted(mounts_under(images), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


@pytest.fixture
def recipe(prune: ModuleType) -> Any:
    return prune.build.Recipe(packages=("python3",), overlay=(), script=b"a tiny recipe")


def mounts_under(directory: Path) -> list[str]:
    top = str(directory.resolve())
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(top + "/")]


def session_image(prune: ModuleType, image_dir: Path, mounted: bool = True) -> Path:
    """What build.py leaves, for a small tree: the erofs file, both manifests; mounted."""
    store = prune.image_store
    tree = image_dir.with_name(f"tree-{image_dir.name}")
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/hostname").write_text(f"deskbox {image_dir.name}\n")
    image_dir.mkdir()
    store.write_contents(tree, image_dir / store.CONTENTS)
    store.make_image(tree, image_dir / store.IMAGE_FILE)
    manifest = {"hash": image_dir.name, "image": store.image_record(image_dir / store.IMAGE_FILE)}
    (image_dir / store.MANIFEST).write_text(json.dumps(manifest))
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    if mounted:
        store.check(image_dir)
    return image_dir


def vm_guest(directory: Path, image_hash: str) -> Path:
    """A VM guest as vm_guest.py leaves it: a kernel, the image's file by its link."""
    directory.mkdir()
    (directory / "vmlinux").write_bytes(b"k" * MiB)
    (directory / "rootfs.erofs").symlink_to(f"../{image_hash}/rootfs.erofs")
    (directory / "manifest.json").write_text(json.dumps({"rootfs": {"image_hash": image_hash}}))
    return directory


def oci_image(directory: Path, image_hash: str, size: int = MiB) -> Path:
    directory.mkdir()
    (directory / "deskbox-session.oci.tar").write_bytes(b"o" * size)
    (directory / "manifest.json").write_text(json.dumps({"image_hash": image_hash}))
    return directory


def base(directory: Path) -> Path:
    (directory / "rootfs/etc").mkdir(parents=True)
    (directory / "rootfs/etc/os-release").write_bytes(b"b" * MiB)
    return directory


def listing(images: Path) -> list[str]:
    return sorted(path.name for path in images.iterdir() if path.is_dir())


def test_prune_removes_every_image_but_the_current_one_and_says_what_it_freed(
    prune: ModuleType, images: Path, recipe: Any
) -> None:
    current = session_image(prune, images / recipe.hash)
    old = session_image(prune, images / "1111111111111111")
    older = session_image(prune, images / "2222222222222222", mounted=False)
    vm_guest(images / "vm-aaaaaaaaaaaaaaaa", old.name)
    oci_image(images / "oci-bbbbbbbbbbbbbbbb", older.name, size=8 * MiB)
    oci_image(images / "oci-cccccccccccccccc", recipe.hash)  # made from the current one
    base(images / f"base-{recipe.base_hash}")
    base(images / "base-0000000000000000")
    (images / ".building-3333333333333333-x1y2").mkdir()  # what a killed build left
    before = listing(images)

    said: list[str] = []
    dry = prune.prune(images, recipe, said.append, print, dry_run=True)
    assert listing(images) == before and dry.kept == []
    assert len(mounts_under(images)) == 2
    assert said[-1].startswith("would free ") and "in 6 directories" in said[-1]

    said.clear()
    pruned = prune.prune(images, recipe, said.append, print)
    assert pruned.kept == [] and pruned.removed == 6
    assert listing(images) == [recipe.hash, f"base-{recipe.base_hash}", "oci-cccccccccccccccc"]
    assert mounts_under(images) == [str(current / "rootfs")]  # the old image's mount is gone
    assert prune.image_store.verify(current) == []
    assert said[:-1] == [
        "removed .building-3333333333333333-x1y2 (0 MiB): left by a stopped build",
        "removed base-0000000000000000 (1 MiB): mmdebstrap stage of another package list",
        "removed oci-bbbbbbbbbbbbbbbb (8 MiB): OCI image of the image 2222222222222222",
        "removed vm-aaaaaaaaaaaaaaaa (1 MiB): VM guest of the image 1111111111111111",
        "removed 1111111111111111 (0 MiB): session image of another recipe",
        "removed 2222222222222222 (0 MiB): session image of another recipe",
    ]
    assert re.fullmatch(rf"freed 1[01] MiB in 6 directories; kept the current image "
                        rf"{recipe.hash}", said[-1]), said[-1]
    assert pruned.freed >= 10 * MiB


SANDBOX = ("import os, sys, time\n"
           "os.chroot(sys.argv[1])\n"
           "os.chdir('/')\n"
           "print('ready', flush=True)\n"
           "time.sleep(300)\n")


def test_an_image_a_sandbox_or_a_vm_runs_on_is_kept_and_the_processes_named(
    prune: ModuleType, images: Path, recipe: Any
) -> None:
    session_image(prune, images / recipe.hash)
    ran_on = session_image(prune, images / "1111111111111111")
    guest = vm_guest(images / "vm-aaaaaaaaaaaaaaaa", ran_on.name)
    held = session_image(prune, images / "2222222222222222", mounted=False)
    held_guest = vm_guest(images / "vm-bbbbbbbbbbbbbbbb", held.name)
    with subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", SANDBOX,
         str(ran_on / "rootfs")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    ) as sandbox, open(held_guest / "rootfs.erofs", "rb") as qemu_disk:
        assert sandbox.stdout is not None
        try:
            assert sandbox.stdout.readline() == "ready\n"
            said: list[str] = []
            pruned = prune.prune(images, recipe, said.append, print)
        finally:
            sandbox.kill()
        assert sorted(pruned.kept) == [ran_on.name, held.name]
        assert said[:2] == [
            f"kept {ran_on.name}: in use by pid {sandbox.pid} ({comm(sandbox.pid)}); "
            "prune again once that session or process has ended",
            f"kept {held.name}: in use by pid {os.getpid()} ({comm(os.getpid())}); "
            "prune again once that session or process has ended",
        ]
        assert said[-1].startswith("freed 0 MiB in 0 directories")
        assert mounts_under(ran_on) == [str(ran_on / "rootfs")]  # not unmounted under it
        assert ran_on.is_dir() and guest.is_dir() and held.is_dir() and held_guest.is_dir()
        qemu_disk.read(1)

    said.clear()
    pruned = prune.prune(images, recipe, said.append, print)
    assert pruned.kept == [] and pruned.removed == 4
    assert listing(images) == [recipe.hash]


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_a_build_says_what_the_images_of_other_recipes_take(
    prune: ModuleType, images: Path, recipe: Any
) -> None:
    for name in ("1111111111111111", "2222222222222222", recipe.hash):
        (images / name).mkdir()
        with open(images / name / "rootfs.erofs", "wb") as image:
            image.truncate(3 * 2**30 // 10)  # sparse: its size is what is said
    said: list[str] = []
    prune.build._mention_other_images(images, recipe.hash, said.append)
    assert said == [f"2 images of other recipes take 0.6 GiB in {images}: "
                    "`deskbox image prune` removes those no session uses"]


def test_deskbox_image_prune(images: Path) -> None:
    """The command, on the recipe of this checkout (whose image is not built here)."""
    session_image_of_files = images / "0123456789abcdef"
    session_image_of_files.mkdir()
    (session_image_of_files / "rootfs.erofs").write_bytes(b"e" * 2 * MiB)
    oci = oci_image(images / "oci-0123456789abcdef", "0123456789abcdef", size=3 * MiB)
    state = images.parent
    with open(session_image_of_files / "rootfs.erofs", "rb"):
        kept = subprocess.run([DESKBOX, "image", "prune", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=300)
    assert kept.returncode == 1, kept.stderr
    assert kept.stdout.startswith(f"kept 0123456789abcdef: in use by pid {os.getpid()} ")
    assert oci.is_dir()

    done = subprocess.run([DESKBOX, "image", "prune", "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == [
        "removed oci-0123456789abcdef (3 MiB): OCI image of the image 0123456789abcdef",
        "removed 0123456789abcdef (2 MiB): session image of another recipe",
    ]
    assert re.fullmatch(r"freed 5 MiB in 2 directories; the current image [0-9a-f]{16} is "
                        r"not built \(deskbox image build\)", lines[2]), lines[2]
    assert listing(images) == []


def test_an_idle_server_is_named_as_its_images_user(
    prune: ModuleType, tmp_path: Path
) -> None:
    """A server with no session between its sessions still serves from its image: a prune
    from a newer recipe keeps it, naming the server (it removed the image from under the
    server's next session). Dry runs, on the suite's shared cache."""
    current = prune.build.load_recipe()
    newer = dataclasses.replace(current, script=current.script + b"\n# a newer recipe\n")
    images = IMAGE_STATE_DIR / "images"
    said: list[str] = []
    with serve(tmp_path / "state", tmp_path / "server.log") as (server, client):
        assert client.get("/v1/sessions").json()["sessions"] == []  # idle
        pruned = prune.prune(images, newer, said.append, print, dry_run=True)
        assert pruned.kept == [current.hash], said
        assert said[0].startswith(f"kept {current.hash}: in use by pid "), said
        assert f"{server.pid} (deskbox)" in said[0], said
    said.clear()
    prune.prune(images, newer, said.append, print, dry_run=True)
    assert f"would remove {current.hash} " in "\n".join(said)  # only a dry run: still there
