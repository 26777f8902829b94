"""Which root disk format boots a VM session fastest: erofs, ext4 or squashfs (issue 16).

Run from the repository root (root; builds the session image and the VM guest first if
missing, in ``DESKBOX_IMAGE_STATE_DIR``, default ``.state/``; needs ``mkfs.ext4`` and, for
squashfs, ``mksquashfs`` from squashfs-tools)::

    .venv/bin/python bench/vm_rootfs.py [--rounds 2] [--formats erofs,ext4,squashfs]

The guest the server boots has the session image's own erofs file as its root disk. This
script makes the same tree as an ext4 file (``mkfs.ext4 -d``, no journal) and a squashfs
file (zstd), and initramfs variants whose /init mounts that format (the kernel's modules
for it added), in a temporary directory. Then, in rounds (each format once per round, so
that a drift of the host's speed spreads over all of them), it boots each variant through
the vm engine itself (no server) and prints, per format, the disk's size and the medians
of create → the agent listening → the browser's window painted → the desktop connected
(the agent's ``ready`` call answered: a session's "running"). Each boot's figures are
printed as they come. Every VM is destroyed and the temporary files removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from api import interrupt_on_sigterm  # bench/api.py (this script's directory)

from deskbox_server.agent.client import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.agent.limits import AgentLimits
from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.image import build_image
from deskbox_server.engines.vm.engine import VmEngine
from deskbox_server.settings import Settings, default_recipe_dir

RECIPE = default_recipe_dir()
sys.path.insert(0, str(RECIPE))
import vm_guest  # noqa: E402 (desktop_image/vm_guest.py: the guest's own build)

FORMATS = ("erofs", "ext4", "squashfs")
EXTRA_MODULES = {"erofs": (), "ext4": ("ext4",), "squashfs": ("squashfs",)}
MOUNT = b"mount -t erofs -o ro"  # vm_init.sh's mount of the root disk


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}): {done.stderr[-2000:]}")


def variants(guest: Path, work: Path, formats: Sequence[str]) -> dict[str, Path]:
    """A guest directory per format: the guest's kernel, an initramfs mounting that
    format, and the root disk in it."""
    packages = vm_guest.resolve_packages(print, None, update=False)
    debs, unpacked = work / "debs", work / "unpacked"
    debs.mkdir()
    for deb in vm_guest._download((packages.kernel, packages.busybox), debs):
        vm_guest._unpack(deb, unpacked)
    (module_root,) = sorted((unpacked / "lib/modules").iterdir())
    busybox = (unpacked / "bin/busybox").read_bytes()
    init = vm_guest.INIT_SCRIPT.read_bytes()
    assert MOUNT in init, "vm_init.sh no longer mounts the root as this script expects"
    erofs = (guest / vm_guest.ROOT_DISK).resolve()
    tree = work / "tree"
    tree.mkdir()
    made: dict[str, Path] = {}
    _run("mount", "-t", "erofs", "-o", "loop,ro", str(erofs), str(tree))
    try:
        for name in formats:
            directory = work / f"vm-{name}"
            directory.mkdir()
            disk = directory / vm_guest.ROOT_DISK  # the file name the engine looks for
            print(f"{name}: making the root disk", flush=True)
            if name == "erofs":
                disk.symlink_to(erofs)
            elif name == "ext4":
                size_mb = erofs.stat().st_size * 13 // 10 >> 20
                _run("mkfs.ext4", "-q", "-O", "^has_journal", "-d", str(tree), str(disk),
                     f"{size_mb}M")
            else:
                _run("mksquashfs", str(tree), str(disk), "-comp", "zstd", "-quiet",
                     "-no-progress")
            modules, content = vm_guest._module_order(
                module_root, vm_guest.MODULES + EXTRA_MODULES[name])
            modules = list(dict.fromkeys(modules))  # a shared dependency once
            patched = init.replace(MOUNT, f"mount -t {name} -o ro".encode())
            (directory / vm_guest.INITRAMFS_FILE).write_bytes(
                vm_guest._initramfs(busybox, patched, modules, content))
            shutil.copy(guest / vm_guest.KERNEL_FILE, directory / vm_guest.KERNEL_FILE)
            made[name] = directory
    finally:
        _run("umount", str(tree))
    return made


async def boot(directory: Path, runtime: Path, number: int) -> dict[str, float]:
    """Seconds from create to the agent listening, the window painted, the desktop ready."""
    engine = VmEngine(runtime, lambda _cancel: directory, "auto")
    await engine.prepare()
    if number == 0:
        accelerator = engine.accelerator
        print(f"{directory.name}: accelerator {accelerator.name} ({accelerator.reason})")
    try:
        started = time.monotonic()
        sandbox = await engine.create(SessionSpec(id=f"ses_rootfs{number}"), 600)
        listening = time.monotonic() - started
        try:
            limits = AgentLimits(handshake_timeout_s=60)
            reader, writer = await engine.open_stream(sandbox, limits.read_chunk)
            client = await AgentClient.connect(reader, writer, limits)
            called = time.monotonic() - started
            stages = await AgentDesktop(client).ready(True, 600)
            ready = time.monotonic() - started
            await client.close()
        finally:
            await engine.destroy(sandbox)
    finally:
        await engine.close()  # also when a create failed: nothing of the engine stays
    return {"agent listening": listening, "painted": called + stages["painted"],
            "desktop ready": ready}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    formats = [name for name in args.formats.split(",") if name]
    if unknown := set(formats) - set(FORMATS):
        parser.error(f"unknown formats {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    if "squashfs" in formats and shutil.which("mksquashfs") is None:
        parser.error("mksquashfs is missing: apt-get install squashfs-tools, or leave "
                     "squashfs out of --formats")
    interrupt_on_sigterm()
    images = Settings().image_cache_dir  # the server's, as api.py's servers use
    guest = build_image(images, RECIPE, print, timeout_s=1800,
                        script_name="vm_guest.py")
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in formats}
    with tempfile.TemporaryDirectory(prefix="deskbox-rootfs-") as temporary:
        work = Path(temporary)
        made = variants(guest, work, formats)
        for round_number in range(args.rounds):
            for name in formats:
                seconds = asyncio.run(boot(made[name], work / "runtime", len(figures[name])))
                figures[name].append(seconds)
                print(f"round {round_number + 1} {name}: "
                      + ", ".join(f"{stage} {value:.1f} s" for stage, value in seconds.items()),
                      flush=True)
        sizes = {name: (made[name] / vm_guest.ROOT_DISK).resolve().stat().st_size
                 for name in formats}
    print(f"\nRoot disk formats, create → stage in s, medians of {args.rounds} boots each\n")
    stages = ("agent listening", "painted", "desktop ready")
    print("| format | disk MiB | " + " | ".join(stages) + " |")
    print("|---|---|" + "---|" * len(stages))
    for name in formats:
        cells = [f"{statistics.median(run[stage] for run in figures[name]):.1f}"
                 for stage in stages]
        print(f"| {name} | {sizes[name] >> 20} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
