"""A built session image on the host: one read-only erofs file, its manifests, its mount.

Layout of ``<state_dir>/images/<recipe hash>/``::

    rootfs.erofs    the root filesystem (erofs, uncompressed, mode 0444)
    contents.jsonl  one line per file of it: ["path", size, "sha256"] (symlinks: their target)
    manifest.json   recipe hash, packages, versions; the image file's size, sha256 and stat
    rootfs/         where the image is mounted, read-only (loop device, erofs)

Every session of every API key runs this root. It is an erofs file system, which has no
write support at all: whatever mount flag a sandbox's root ends up with (CRIU restores
the root bind mount read-write, criu#2632), nothing can change a byte of it.

:func:`check` is the cheap test a server runs at every start; :func:`verify` reads
everything (``deskbox image verify``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CONTENTS",
    "IMAGE_FILE",
    "MANIFEST",
    "MOUNTPOINT",
    "ImageIntegrityError",
    "Mismatch",
    "check",
    "ensure_mounted",
    "make_image",
    "mount_table",
    "mounted_fstype",
    "retire",
    "verify",
    "write_contents",
]

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")
IMAGE_FILE = "rootfs.erofs"
CONTENTS = "contents.jsonl"
MANIFEST = "manifest.json"
MOUNTPOINT = "rootfs"
_CHUNK = 1 << 20
# The programs every sandbox runs first, whose bytes the cheap start-up check compares.
CRITICAL_FILES = (
    "usr/local/bin/deskbox-session",
    "usr/bin/python3.11",
    "usr/bin/Xvfb",
    "usr/bin/openbox",
    "usr/bin/x11vnc",
    "etc/deskbox/openbox-rc.xml",
)

Progress = Callable[[str], None]


class ImageIntegrityError(RuntimeError):
    """The image on disk is not the one that was built; the message says what differs."""


@dataclass(frozen=True)
class Mismatch:
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _entry(root: Path, path: Path) -> tuple[str, int, str] | None:
    """(relative path, size, sha256) of a regular file or symlink; None for the rest."""
    info = path.lstat()
    relative = path.relative_to(root).as_posix()
    if stat.S_ISLNK(info.st_mode):
        target = os.readlink(path).encode()
        return relative, len(target), hashlib.sha256(b"symlink:" + target).hexdigest()
    if stat.S_ISREG(info.st_mode):
        return relative, info.st_size, _sha256_file(path)
    return None


def _walk(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(directory)
        for name in sorted(files) + [d for d in dirs if (base / d).is_symlink()]:
            yield base / name


def write_contents(rootfs: Path, out: Path) -> int:
    """Write the content manifest of the directory ``rootfs``; the number of entries."""
    count = 0
    with open(out, "w") as manifest:
        for path in _walk(rootfs):
            entry = _entry(rootfs, path)
            if entry is not None:
                manifest.write(json.dumps(entry) + "\n")
                count += 1
    return count


def make_image(rootfs: Path, image: Path) -> None:
    """Pack the directory ``rootfs`` into the erofs file ``image`` (mode 0444)."""
    done = subprocess.run(
        ["mkfs.erofs", "--quiet", "-x-1", str(image), str(rootfs)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"mkfs.erofs failed: {done.stderr.strip()[-2000:]}")
    image.chmod(0o444)


def image_record(image: Path) -> dict[str, object]:
    """What manifest.json keeps of the image file: size, sha256 and the stat that the
    start-up check compares (a rewrite changes ctime, which no one can set back)."""
    info = image.stat()
    return {
        "size": info.st_size,
        "sha256": _sha256_file(image),
        "stat": [info.st_ino, info.st_mtime_ns, info.st_ctime_ns],
    }


def _manifest(image_dir: Path) -> dict[str, object]:
    try:
        raw = json.loads((image_dir / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise ImageIntegrityError(f"{image_dir / MANIFEST} is unreadable: {error}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("image"), dict):
        raise ImageIntegrityError(f"{image_dir / MANIFEST} records no image file")
    return raw


def _check_image_file(image_dir: Path, full: bool) -> None:
    record = _manifest(image_dir)["image"]
    assert isinstance(record, dict)
    image = image_dir / IMAGE_FILE
    try:
        info = image.stat()
    except OSError as error:
        raise ImageIntegrityError(f"the image file {image} is missing: {error}") from None
    if info.st_size != record.get("size"):
        raise ImageIntegrityError(
            f"the image file {image} has {info.st_size} bytes; it was built with "
            f"{record.get('size')}"
        )
    unchanged = [info.st_ino, info.st_mtime_ns, info.st_ctime_ns] == record.get("stat")
    if (full or not unchanged) and _sha256_file(image) != record.get("sha256"):
        raise ImageIntegrityError(f"the image file {image} was modified after it was built")


def _contents(image_dir: Path) -> dict[str, tuple[int, str]]:
    entries: dict[str, tuple[int, str]] = {}
    try:
        with open(image_dir / CONTENTS) as manifest:
            for line in manifest:
                path, size, digest = json.loads(line)
                entries[str(path)] = (int(size), str(digest))
    except (OSError, ValueError, TypeError) as error:
        raise ImageIntegrityError(f"{image_dir / CONTENTS} is unreadable: {error}") from None
    return entries


def _compare(root: Path, relative: str, expected: tuple[int, str]) -> Mismatch | None:
    path = root / relative
    try:
        entry = _entry(root, path)
    except FileNotFoundError:
        return Mismatch(relative, "missing")
    if entry is None:
        return Mismatch(relative, "is no longer a file")
    if entry[1] != expected[0]:
        return Mismatch(relative, f"size {entry[1]}, built with {expected[0]}")
    if entry[2] != expected[1]:
        return Mismatch(relative, "content differs from the build")
    return None


def mount_table() -> list[tuple[str, list[str]]]:
    """This process's mounts, in order: (mount point, the line's fields), the point with
    mountinfo's octal escapes (of space, tab, newline and backslash) decoded."""
    table = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        table.append((_OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[4]), fields))
    return table


def mounted_fstype(mountpoint: Path) -> tuple[str, bool] | None:
    """(file system type, superblock read-only) of what is mounted on ``mountpoint``."""
    target = str(mountpoint.resolve())
    found: tuple[str, bool] | None = None
    for point, fields in mount_table():
        if point == target:
            separator = fields.index("-")
            super_options = fields[separator + 3].split(",")
            found = (fields[separator + 1], "ro" in super_options)
    return found


def ensure_mounted(image_dir: Path) -> Path:
    """Mount the image read-only on ``rootfs/`` unless it is; returns the mount point."""
    mountpoint = image_dir / MOUNTPOINT
    mountpoint.mkdir(mode=0o755, exist_ok=True)
    mounted = mounted_fstype(mountpoint)
    if mounted is None:
        with _mount_lock(image_dir.parent):
            mounted = mounted_fstype(mountpoint)  # another process's, made while we waited
            if mounted is None:
                mounted = _mount(image_dir, mountpoint)
    if mounted != ("erofs", True):
        raise ImageIntegrityError(
            f"{mountpoint} holds {mounted}, not the read-only erofs session image"
        )
    return mountpoint


@contextlib.contextmanager
def _mount_lock(images: Path) -> Iterator[None]:
    """Held while one process mounts an image: two servers (or test workers) starting at
    once both found it unmounted, and the second mount failed on the first's ("already
    mounted or mount point busy"). Without write access to ``images`` there is no lock,
    and no mount either (it needs root): the mount's own error says so."""
    try:
        lock = open(images / ".mount.lock", "w")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _mount(image_dir: Path, mountpoint: Path) -> tuple[str, bool] | None:
    """Mount the image on ``mountpoint``; what is mounted there then."""
    done = subprocess.run(
        # Only "ro": a restored sandbox's root inherits this mount's flags (CRIU binds
        # it), and must have exactly those of a fresh one, which runc makes "ro".
        ["mount", "-t", "erofs", "-o", "ro,loop",
         str(image_dir / IMAGE_FILE), str(mountpoint)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"could not mount the session image {image_dir / IMAGE_FILE}: "
            f"{done.stderr.strip()} (mounting needs root, a loop device and erofs)"
        )
    return mounted_fstype(mountpoint)


def retire(image_dir: Path, aside: Path, lazy: bool = False) -> None:
    """Take an image out of use: unmount it from ``rootfs/`` and rename its directory to
    ``aside``, for the caller to remove. Both under the mount lock, so that no start mounts
    it in between. Sandboxes already running on it keep their own mounts of it (and its
    loop device the file). ``lazy``: detach the mount even if a process of this mount
    namespace uses it; else RuntimeError, saying so, and nothing changes."""
    mountpoint = image_dir / MOUNTPOINT
    with _mount_lock(image_dir.parent):
        while mounted_fstype(mountpoint) is not None:  # once per mount stacked there
            _unmount(mountpoint, lazy)
        os.rename(image_dir, aside)


def _unmount(mountpoint: Path, lazy: bool) -> None:
    done = subprocess.run(
        ["umount", *(["--lazy"] if lazy else []), str(mountpoint)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot unmount the session image at {mountpoint}: "
                           f"{done.stderr.strip()}")


def check(image_dir: Path) -> Path:
    """The cheap start-up check, then the mount; ImageIntegrityError if anything is off.

    The image file must be the one built (its stat as recorded, else its sha256 is
    recomputed and compared), and the programs every sandbox runs first
    (:data:`CRITICAL_FILES`) must match the content manifest.
    """
    _check_image_file(image_dir, full=False)
    mountpoint = ensure_mounted(image_dir)
    contents = _contents(image_dir)
    problems = [
        str(problem)
        for relative in CRITICAL_FILES
        if relative in contents
        and (problem := _compare(mountpoint, relative, contents[relative])) is not None
    ]
    if problems:
        raise ImageIntegrityError("the session image differs from its build: "
                                  + "; ".join(problems))
    return mountpoint


def verify(image_dir: Path, progress: Progress = lambda _: None) -> list[Mismatch]:
    """Compare every byte: the image file's sha256, and every file of the mounted image
    with the content manifest (also files that appeared). An empty list: it is intact."""
    problems: list[Mismatch] = []
    try:
        _check_image_file(image_dir, full=True)
    except ImageIntegrityError as error:
        problems.append(Mismatch(IMAGE_FILE, str(error)))
    mountpoint = ensure_mounted(image_dir)
    contents = _contents(image_dir)
    progress(f"verifying {len(contents)} files of {mountpoint}")
    for number, (relative, expected) in enumerate(sorted(contents.items()), 1):
        problem = _compare(mountpoint, relative, expected)
        if problem is not None:
            problems.append(problem)
        if number % 10000 == 0:
            progress(f"  {number} / {len(contents)}")
    for path in _walk(mountpoint):
        relative = path.relative_to(mountpoint).as_posix()
        if relative not in contents and _entry(mountpoint, path) is not None:
            problems.append(Mismatch(relative, "not in the build"))
    return problems
