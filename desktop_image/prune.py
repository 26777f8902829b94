"""Remove what the image cache holds beside the current recipe's session image.

Every change of the recipe builds a new image (GBs) beside the old ones, which stay mounted;
nothing removes them on its own. The cache cannot tell when an old image is done with: it
is shared by every server and test run of the host (``DESKBOX_IMAGE_STATE_DIR``), and one
running another checkout uses another recipe's image. So an operator removes them, with
``deskbox image prune``, which runs this script. Removed from ``<state_dir>/images/``:

* the session images of other recipe hashes (``<hash>/``), unmounted first;
* the VM guests (``vm-*``) and OCI images (``oci-*``) not made from a kept image;
* the mmdebstrap stages of other package lists (``base-*``), which no session runs;
* what stopped builds left (``.building-*``, ``.replaced-*``).

Never the current recipe's image, and never an image in use: one that a process runs on (its
root or working directory on the image's file system: a runc sandbox, in its own mount
namespace, where unmounting on the host would not be refused), or holds a file of open
(the vm engine's QEMU holds the image file, and a server holds the image its engines serve
from while it runs, with no session too); such an image is kept with what was made from
it, and named with those processes. Builds wait meanwhile (the build locks are held).

Usage: ``python desktop_image/prune.py [--state-dir DIR] [--dry-run]``: one line per
directory on stdout (removed, or kept and why) and the space freed; exit status 0, or 1 if
an image was kept because it is in use (or could not be removed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import build
import image_store

__all__ = ["Pruned", "main", "prune"]

Report = Callable[[str], None]
# Every lock a build of the cache holds while it writes there (build.py, vm_guest.py and
# oci_image.py's cached_or_built); none of them is held with another, so taking them in
# this order cannot deadlock with a build.
_BUILD_LOCKS = (".lock", ".vm-guest.lock", ".oci-image.lock")
_LEFTOVERS = (".building-", ".replaced-")
_USERS_SHOWN = 5


@dataclass
class Pruned:
    """What a prune did: bytes freed, directories removed, and whether any was kept that
    should have gone (in use, or not removable)."""

    freed: int = 0
    removed: int = 0
    kept: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Doomed:
    path: Path
    why: str


def prune(images: Path, recipe: build.Recipe, report: Report, progress: build.Progress,
          dry_run: bool = False) -> Pruned:
    """Remove from ``images`` what the module doc lists, ``recipe`` being the current one;
    one line per directory to ``report``. ``dry_run``: remove nothing, say what would go."""
    pruned = Pruned()
    with _build_locks(images, progress):
        users = _image_users(images, recipe)
        for image, pids in sorted(users.items()):
            pruned.kept.append(image)
            report(f"kept {image}: in use by {_describe(pids)}; prune again once that "
                   "session or process has ended")
        for doomed in _doomed(images, recipe, kept=set(users) | {recipe.hash}):
            _remove(doomed, pruned, report, dry_run)
    verb = "would free" if dry_run else "freed"
    built = (images / recipe.hash / image_store.IMAGE_FILE).is_file()
    current = (f"kept the current image {recipe.hash}" if built else
               f"the current image {recipe.hash} is not built (deskbox image build)")
    report(f"{verb} {_size(pruned.freed)} in {pruned.removed} directories; {current}")
    return pruned


@contextlib.contextmanager
def _build_locks(images: Path, progress: build.Progress) -> Iterator[None]:
    with contextlib.ExitStack() as held:
        for name in _BUILD_LOCKS:
            held.enter_context(build._locked(images / name, progress))
        yield


def _doomed(images: Path, recipe: build.Recipe, kept: set[str]) -> list[_Doomed]:
    """What goes, in order: what was made from an image before the image itself."""
    doomed: list[_Doomed] = []
    for path in sorted(images.iterdir()):
        name = path.name
        if not path.is_dir() or path.is_symlink():
            continue
        if name.startswith(_LEFTOVERS):
            doomed.append(_Doomed(path, "left by a stopped build"))
        elif name.startswith("base-") and name != f"base-{recipe.base_hash}":
            doomed.append(_Doomed(path, "mmdebstrap stage of another package list"))
        elif name.startswith(tuple(build.MADE_FROM_IMAGE)):
            made_from = _made_from(path)
            if made_from is not None and made_from not in kept:
                what = "VM guest" if name.startswith("vm-") else "OCI image"
                doomed.append(_Doomed(path, f"{what} of the image {made_from}"))
        elif build.IMAGE_NAME.fullmatch(name) and name not in kept:
            doomed.append(_Doomed(path, "session image of another recipe"))
    # Made-from directories first: none of them is left naming a removed image.
    return sorted(doomed, key=lambda d: build.IMAGE_NAME.fullmatch(d.path.name) is not None)


def _made_from(directory: Path) -> str | None:
    """The image hash a VM guest's or OCI image's manifest names; None if unreadable (left
    alone: what it is made from is unknown)."""
    for prefix, keys in build.MADE_FROM_IMAGE.items():
        if directory.name.startswith(prefix):
            value = build._manifest_value(directory / "manifest.json", keys)
            return value if isinstance(value, str) else None
    return None


def _remove(doomed: _Doomed, pruned: Pruned, report: Report, dry_run: bool) -> None:
    path = doomed.path
    if dry_run:
        size = _disk_usage(path)  # a mounted image's mount is not counted: not its directory's
        report(f"would remove {path.name} ({_size(size)}): {doomed.why}")
        pruned.freed += size
        pruned.removed += 1
        return
    try:
        if path.name.startswith(_LEFTOVERS):
            size = _disk_usage(path)
            build._remove_staging(path)  # unmounts what a stopped build left in its chroot
        else:
            size = _remove_directory(path)
    except (OSError, RuntimeError) as error:
        pruned.kept.append(path.name)
        report(f"kept {path.name}: could not remove it: {error}")
        return
    report(f"removed {path.name} ({_size(size)}): {doomed.why}")
    pruned.freed += size
    pruned.removed += 1


def _remove_directory(path: Path) -> int:
    """Unmount (an image), then remove ``path``; the bytes freed. Not lazily unmounted: a
    process of this mount namespace that uses it makes the unmount fail, and it stays."""
    aside = Path(tempfile.mkdtemp(prefix=f".replaced-{path.name}-", dir=path.parent))
    try:
        image_store.retire(path, aside)
    except BaseException:
        aside.rmdir()
        raise
    size = _disk_usage(aside)
    shutil.rmtree(aside)
    return size


def _image_users(images: Path, recipe: build.Recipe) -> dict[str, dict[int, str]]:
    """The session images of other recipes that processes use: their names, and for each
    the processes (pid: command name)."""
    files: dict[tuple[int, int], str] = {}  # the image file's (device, inode)
    devices: dict[int, str] = {}  # the device numbers of the file systems mounted from it
    loops = _loop_devices()
    for path in images.iterdir():
        if not build.IMAGE_NAME.fullmatch(path.name) or path.name == recipe.hash:
            continue
        devices.update(dict.fromkeys(_mounted_device(path), path.name))
        with contextlib.suppress(OSError):
            info = (path / image_store.IMAGE_FILE).stat()
            files[(info.st_dev, info.st_ino)] = path.name
            devices.update(dict.fromkeys(loops.get((info.st_dev, info.st_ino), ()), path.name))
    users: dict[str, dict[int, str]] = {}
    for pid, used in _processes_using(set(files), set(devices)):
        image = files[used] if isinstance(used, tuple) else devices[used]
        users.setdefault(image, {})[pid] = _command(pid)
    return users


def _mounted_device(image_dir: Path) -> set[int]:
    """The device of the image's mount on rootfs/, if mounted (its file may be gone)."""
    mountpoint = image_dir / image_store.MOUNTPOINT
    if image_store.mounted_fstype(mountpoint) is None:
        return set()
    return {mountpoint.stat().st_dev}


def _loop_devices() -> dict[tuple[int, int], set[int]]:
    """The loop devices by the (device, inode) of their backing file. An image's are the
    file systems of its mounts in every mount namespace (a sandbox's among them)."""
    done = subprocess.run(
        ["losetup", "--list", "--json", "--output", "MAJ:MIN,BACK-INO,BACK-MAJ:MIN"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    # Unknown loop devices would hide sandboxes: no prune then.
    if done.returncode != 0:
        raise RuntimeError(f"losetup cannot list the loop devices: {done.stderr.strip()}")
    if not done.stdout.strip():
        return {}  # no loop device at all
    try:
        loops = json.loads(done.stdout)["loopdevices"]
    except (ValueError, KeyError, TypeError) as error:
        raise RuntimeError(f"losetup's list of loop devices is unreadable: {error}") from None
    found: dict[tuple[int, int], set[int]] = {}
    for loop in loops:
        backing = _device_number(str(loop.get("back-maj:min", "")))
        number = _device_number(str(loop.get("maj:min", "")))
        if backing is not None and number is not None and isinstance(loop.get("back-ino"), int):
            found.setdefault((backing, loop["back-ino"]), set()).add(number)
    return found


def _device_number(major_minor: str) -> int | None:
    major, _, minor = major_minor.strip().partition(":")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return os.makedev(int(major), int(minor))


def _processes_using(
    files: set[tuple[int, int]], devices: set[int]
) -> Iterator[tuple[int, tuple[int, int] | int]]:
    """(pid, what it uses) for each process whose root, working directory or executable is
    on one of ``devices``, or that holds open one of ``files`` or a file on ``devices``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        for link in ("root", "cwd", "exe", *_fd_links(entry)):
            try:
                info = os.stat(entry / link)
            except OSError:
                continue  # ended, a kernel thread, or not ours to see
            if (info.st_dev, info.st_ino) in files:
                yield pid, (info.st_dev, info.st_ino)
                break
            if info.st_dev in devices:
                yield pid, info.st_dev
                break


def _fd_links(process: Path) -> list[str]:
    try:
        return [f"fd/{fd}" for fd in os.listdir(process / "fd")]
    except OSError:
        return []


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _describe(pids: dict[int, str]) -> str:
    shown = [f"{pid} ({command})" for pid, command in sorted(pids.items())[:_USERS_SHOWN]]
    more = len(pids) - len(shown)
    return "pid " + ", ".join(shown) + (f" and {more} more" if more else "")


def _disk_usage(top: Path) -> int:
    """Bytes of disk the files under ``top`` take, each inode once; what is mounted below it
    (an image's file system on its rootfs/) is not counted."""
    device = top.lstat().st_dev
    seen: set[int] = set()
    total = 0
    for directory, dirs, files in os.walk(top):
        for name in [*files, *dirs]:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if info.st_dev != device:
                if name in dirs:
                    dirs.remove(name)
                continue
            if info.st_ino not in seen:
                seen.add(info.st_ino)
                total += info.st_blocks * 512
    return total


def _size(size: int) -> str:
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--state-dir", type=Path,
        default=Path(os.environ.get("DESKBOX_STATE_DIR", build.RECIPE_DIR.parent / ".state")),
    )
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be removed, remove nothing")
    args = parser.parse_args(argv)
    images = args.state_dir.resolve() / "images"

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def report(line: str) -> None:
        print(line, flush=True)

    if not images.is_dir():
        report(f"nothing is cached in {images}")
        return 0
    try:
        pruned = prune(images, build.load_recipe(), report, progress, args.dry_run)
    except (OSError, RuntimeError) as error:
        progress(f"error: cannot prune {images}: {error}")
        return 2
    return 1 if pruned.kept else 0


if __name__ == "__main__":
    sys.exit(main())
