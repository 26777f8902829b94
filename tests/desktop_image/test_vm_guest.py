"""The VM engine's guest (desktop_image/vm_guest.py): what it is made of, without booting it.

The guest is built once into the shared image cache (tests/images.py) beside the session
image; tests/vm/ boots it. Here: the kernel is an ELF QEMU can boot by PVH, the initramfs
holds /init and every module /init loads with its dependencies before it, the build is
cached, and the pieces that need no build (cpio, bzImage, signatures) on their own.
"""

from __future__ import annotations

import json
import lzma
import os
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from ..images import IMAGE_STATE_DIR, REPO, progress, recipe_module

RECIPE = REPO / "desktop_image"
# A cold cache builds the session image (minutes) and the guest (a download, ~15 s).
BUILD_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def vm_guest() -> Iterator[ModuleType]:
    """desktop_image/vm_guest.py as a module."""
    with recipe_module("vm_guest") as module:
        yield module


@pytest.fixture(scope="module")
def guest(vm_guest: ModuleType) -> Path:
    directory: Path = vm_guest.ensure_guest(IMAGE_STATE_DIR, progress)
    return directory


@pytest.fixture(scope="module")
def initramfs(vm_guest: ModuleType, guest: Path) -> dict[str, tuple[int, bytes]]:
    members: dict[str, tuple[int, bytes]] = vm_guest.cpio_members(
        (guest / vm_guest.INITRAMFS_FILE).read_bytes()
    )
    return members


def _modules(initramfs: dict[str, tuple[int, bytes]]) -> list[str]:
    return initramfs["lib/modules/load.order"][1].decode().split()


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_guest_has_its_files_and_the_session_image(vm_guest: ModuleType, guest: Path) -> None:
    build = sys.modules["build"]
    assert guest.name.startswith("vm-")
    for name in vm_guest.GUEST_FILES:
        assert (guest / name).is_file(), name
    image = build.image_dir(IMAGE_STATE_DIR, build.load_recipe()) / "rootfs.erofs"
    assert (guest / "rootfs.erofs").samefile(image)
    # Linked, not hard-linked: the image's recorded stat (ctime) must stay as built.
    assert (guest / "rootfs.erofs").is_symlink()


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_kernel_is_an_elf_with_a_pvh_entry(vm_guest: ModuleType, guest: Path) -> None:
    kernel = (guest / vm_guest.KERNEL_FILE).read_bytes()
    assert kernel[:4] == b"\x7fELF" and kernel[4] == 2  # 64-bit
    assert vm_guest.has_pvh_note(kernel)


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_initramfs_holds_init_busybox_and_a_console(
    initramfs: dict[str, tuple[int, bytes]],
) -> None:
    mode, init = initramfs["init"]
    assert init == (RECIPE / "vm_init.sh").read_bytes()
    assert stat.S_ISREG(mode) and mode & 0o111
    mode, busybox = initramfs["bin/busybox"]
    assert busybox[:4] == b"\x7fELF" and mode & 0o111
    assert stat.S_ISCHR(initramfs["dev/console"][0])
    for directory in ("proc", "sys", "dev", "newroot"):
        assert stat.S_ISDIR(initramfs[directory][0]), directory


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_every_module_comes_after_its_dependencies(
    vm_guest: ModuleType, initramfs: dict[str, tuple[int, bytes]],
) -> None:
    order = _modules(initramfs)
    assert set(vm_guest.MODULES) <= set(order)  # Debian builds none of them in
    assert len(order) == len(set(order))
    for position, name in enumerate(order):
        module = initramfs[f"lib/modules/{name}.ko"][1]
        assert module[:4] == b"\x7fELF", name
        assert vm_guest.strip_signature(module) == module, f"{name} is still signed"
        info = vm_guest.module_info(module)
        assert info["name"] == [name]
        depends = [dep for value in info.get("depends", []) for dep in value.split(",") if dep]
        for dependency in depends:
            assert dependency in order[:position], f"{name} needs {dependency} first"
    # libcrc32c's soft dependency is an alias ("crc32c"): its provider loads before it.
    if "libcrc32c" in order:
        assert order.index("crc32c_generic") < order.index("libcrc32c")
    # /init loads exactly this list (it has no other insmod).
    script = (RECIPE / "vm_init.sh").read_text()
    assert script.count("insmod ") == 1 and "/lib/modules/load.order" in script


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_init_is_valid_busybox_sh(tmp_path: Path, initramfs: dict[str, tuple[int, bytes]]) -> None:
    busybox = tmp_path / "busybox"
    busybox.write_bytes(initramfs["bin/busybox"][1])
    busybox.chmod(0o755)
    done = subprocess.run([str(busybox), "sh", "-n", str(RECIPE / "vm_init.sh")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_build_is_cached(vm_guest: ModuleType, guest: Path) -> None:
    built = (guest / vm_guest.MANIFEST).stat().st_mtime_ns
    started = time.monotonic()
    again = vm_guest.ensure_guest(IMAGE_STATE_DIR, progress)
    assert again == guest
    assert time.monotonic() - started < 5.0
    assert (guest / vm_guest.MANIFEST).stat().st_mtime_ns == built


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_manifest(vm_guest: ModuleType, guest: Path,
                      initramfs: dict[str, tuple[int, bytes]]) -> None:
    manifest = json.loads((guest / vm_guest.MANIFEST).read_text())
    build = sys.modules["build"]
    assert guest.name == f"vm-{manifest['hash']}"
    kernel = manifest["kernel"]
    assert kernel["package"].startswith("linux-image-") and kernel["version"]
    assert kernel["size"] == (guest / vm_guest.KERNEL_FILE).stat().st_size
    assert manifest["busybox"]["package"] == "busybox-static"
    assert manifest["modules"] == _modules(initramfs)
    assert manifest["initramfs"]["size"] == (guest / vm_guest.INITRAMFS_FILE).stat().st_size
    assert manifest["rootfs"]["image_hash"] == build.load_recipe().hash
    assert manifest["rootfs"]["size"] == (guest / "rootfs.erofs").stat().st_size
    assert time.strptime(manifest["built_at"], "%Y-%m-%dT%H:%M:%SZ")


# --- without a build -----------------------------------------------------------------

def test_cpio_round_trip(vm_guest: ModuleType) -> None:
    members = [
        vm_guest._Member("dir", 0o040755),
        vm_guest._Member("dir/file", 0o100644, b"abc"),
        vm_guest._Member("dir/odd", 0o100755, b"12345"),
        vm_guest._Member("link", 0o120777, b"dir/file"),
        vm_guest._Member("dev/console", 0o020600, rdev=(5, 1)),
    ]
    archive = vm_guest._cpio(members)
    assert len(archive) % 4 == 0
    assert vm_guest.cpio_members(archive) == {m.path: (m.mode, m.data) for m in members}


def _bzimage(payload: bytes) -> bytes:
    setup = bytearray(2 * 512)  # setup_sects = 1
    setup[0x1F1] = 1
    setup[0x202:0x206] = b"HdrS"
    struct.pack_into("<II", setup, 0x248, 16, len(payload))
    return bytes(setup) + b"\0" * 16 + payload + b"trailer"


def test_vmlinux_comes_out_of_an_xz_bzimage(vm_guest: ModuleType) -> None:
    elf = b"\x7fELF\x02" + os.urandom(1000)
    payload = lzma.compress(elf, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC32)
    assert vm_guest.extract_vmlinux(_bzimage(payload + struct.pack("<I", len(elf)))) == elf
    with pytest.raises(RuntimeError, match="not handled"):
        vm_guest.extract_vmlinux(_bzimage(b"\x89LZO" + bytes(100)))
    with pytest.raises(RuntimeError, match="bzImage"):
        vm_guest.extract_vmlinux(bytes(4096))


def test_a_module_signature_is_stripped(vm_guest: ModuleType) -> None:
    module = b"\x7fELF" + bytes(100)
    signature = os.urandom(40)
    signed = (module + signature + bytes(8) + struct.pack(">I", len(signature))
              + b"~Module signature appended~\n")
    assert vm_guest.strip_signature(signed) == module
    assert vm_guest.strip_signature(module) == module


def test_a_failed_download_says_what_apt_said(vm_guest: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="apt-get download no-such-package-deskbox=1 failed"):
        vm_guest._download([("no-such-package-deskbox", "1")], tmp_path)
