"""Build the session root filesystem with mmdebstrap, cached under the state directory.

The recipe is ``packages.txt`` (Debian packages), the files under ``rootfs/`` (copied over
the installed system: the in-sandbox launchers, /etc/hosts, ...), the desktop agent
(``agent/requirements.txt``, its pinned wheels, and the package ``agent/deskbox_agent/``,
installed into /usr/lib/deskbox-agent by ``agent_install.py``), this script,
``agent_install.py`` and ``image_store.py``. Images live in
``<state_dir>/images/<recipe-hash>/`` (layout in image_store.py); an image is built into a
temporary directory next to it and renamed into place, so a half-built image is never
used, and an image that exists is never rebuilt unless asked (``--rebuild``, for one that
fails its integrity check: it is unmounted and replaced). The agent's wheels are downloaded
once into ``<state_dir>/wheels/``.

Two stages keep edits to the overlay cheap: the mmdebstrap result is cached by the hash of
its command line (``images/base-<hash>``) and the final tree is a hard-linked copy of it
with the overlay written over (every overlay file replaces its link, so the base stays
intact). That tree is packed into a read-only erofs file with a content manifest; every
start checks the image cheaply and mounts it read-only at ``rootfs/``, which sessions use
as their root.

Usage: ``python desktop_image/build.py [--state-dir DIR] [--verify | --rebuild]``; the last
line printed is the mounted root filesystem's path (``--verify``: one line per file that
differs from the build, exit status 1 if any).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import agent_install
import image_store

__all__ = [
    "Recipe", "cached_or_built", "ensure_image", "image_dir", "load_recipe", "made_from",
    "made_from_image", "main",
]

RECIPE_DIR = Path(__file__).resolve().parent
SUITE = "bookworm"
# bookworm-security carries Chromium's security updates; bookworm-updates the point fixes.
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# Documentation and translations are never read in a session; copyright files stay.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
APT_OPTIONS = ('Acquire::Languages "none"',)
# Files of the server package that the session needs too: (path in the repository, in image).
SHARED_FILES = (
    ("server/deskbox_server/engines/data/openbox-rc.xml", "etc/deskbox/openbox-rc.xml"),
    ("server/deskbox_server/engines/data/gtk-settings.ini", "etc/gtk-3.0/settings.ini"),
)

Progress = Callable[[str], None]
# The exit status of a start whose cached image fails image_store.check (image.py reads it).
INTEGRITY_FAILED = 4


@dataclass(frozen=True)
class Recipe:
    """Everything an image is made from; its hash names the image."""

    packages: tuple[str, ...]
    overlay: tuple[tuple[str, bytes, int], ...]  # (relative path, content, mode)
    script: bytes
    requirements: bytes = b""  # agent/requirements.txt
    agent: tuple[tuple[str, bytes], ...] = ()  # agent/deskbox_agent/: (relative path, content)

    def mmdebstrap_argv(self, target: Path) -> list[str]:
        argv = ["mmdebstrap", "--variant=apt", "--mode=root", "--format=directory"]
        argv.append("--include=" + ",".join(self.packages))
        argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
        argv += [f"--aptopt={option}" for option in APT_OPTIONS]
        argv += [SUITE, str(target), *SOURCES]
        return argv

    @property
    def base_hash(self) -> str:
        """Names the mmdebstrap stage: only its command line matters to it."""
        argv = self.mmdebstrap_argv(Path("TARGET"))
        return hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]

    @property
    def hash(self) -> str:
        digest = hashlib.sha256()
        digest.update(self.base_hash.encode())
        digest.update(hashlib.sha256(self.script).digest())
        for path, content, mode in self.overlay:
            digest.update(f"\0{path}\0{mode:o}\0".encode())
            digest.update(hashlib.sha256(content).digest())
        digest.update(b"\0agent-requirements\0" + hashlib.sha256(self.requirements).digest())
        for path, content in self.agent:
            digest.update(f"\0agent\0{path}\0".encode())
            digest.update(hashlib.sha256(content).digest())
        return digest.hexdigest()[:16]


def load_recipe(recipe_dir: Path = RECIPE_DIR) -> Recipe:
    packages: list[str] = []
    for line in (recipe_dir / "packages.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            packages.append(name)
    overlay_root = recipe_dir / "rootfs"
    overlay: list[tuple[str, bytes, int]] = []
    for path in sorted(p for p in overlay_root.rglob("*") if p.is_file()):
        mode = 0o755 if os.access(path, os.X_OK) else 0o644
        overlay.append((path.relative_to(overlay_root).as_posix(), path.read_bytes(), mode))
    for source, target in SHARED_FILES:
        overlay.append((target, (recipe_dir.parent / source).read_bytes(), 0o644))
    here = Path(__file__).resolve()
    script = b"".join(
        (here.parent / name).read_bytes()
        for name in (here.name, "agent_install.py", "image_store.py")
    )
    requirements = (recipe_dir / "agent" / "requirements.txt").read_bytes()
    return Recipe(tuple(sorted(set(packages))), tuple(overlay), script, requirements,
                  _agent_files(recipe_dir / "agent" / agent_install.AGENT_PACKAGE))


def _agent_files(package: Path) -> tuple[tuple[str, bytes], ...]:
    """The agent package's files; bytecode a test run left in the source tree is no part
    of it (the build compiles its own)."""
    if not package.is_dir():
        return ()
    return tuple(
        (path.relative_to(package).as_posix(), path.read_bytes())
        for path in sorted(package.rglob("*"))
        if path.is_file() and "__pycache__" not in path.relative_to(package).parts
        and path.suffix not in (".pyc", ".pyo")
    )


# The name of a session image's directory: its recipe hash (Recipe.hash).
IMAGE_NAME = re.compile(r"[0-9a-f]{16}")


def image_dir(state_dir: Path, recipe: Recipe) -> Path:
    return state_dir / "images" / recipe.hash


def ensure_image(
    state_dir: Path, recipe: Recipe | None = None, progress: Progress = print,
    rebuild: bool = False,
) -> Path:
    """The mounted root filesystem of ``recipe`` (default: this directory's), built if
    missing (``rebuild``: built again, replacing the cached one); ImageIntegrityError if
    the cached image fails the start-up check."""
    recipe = recipe or load_recipe()
    images = state_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    final = images / recipe.hash
    if not rebuild and (final / image_store.IMAGE_FILE).is_file():
        progress(f"image {recipe.hash} is cached")
        return image_store.check(final)
    with _locked(images / ".lock", progress):
        if rebuild or not (final / image_store.IMAGE_FILE).is_file():  # else built meanwhile
            _build(images, final, recipe, progress)
    return image_store.check(final)


def _build(images: Path, final: Path, recipe: Recipe, progress: Progress) -> None:
    base = _ensure_base(images, recipe, progress)
    started = time.monotonic()
    with _staging(images, recipe.hash) as staging:
        tree = staging / "tree"
        progress(f"image {recipe.hash}: linking the base and writing the overlay")
        subprocess.run(["cp", "-al", str(base), str(tree)], check=True)
        for relative, content, mode in recipe.overlay:
            _replace_file(tree / relative, content, mode)
        agent = _install_agent(images, staging, tree, recipe, progress)
        progress(f"image {recipe.hash}: hashing every file for the content manifest")
        files = image_store.write_contents(tree, staging / image_store.CONTENTS)
        progress(f"image {recipe.hash}: packing {files} files into a read-only erofs image")
        image = staging / image_store.IMAGE_FILE
        image_store.make_image(tree, image)
        manifest = {
            "hash": recipe.hash,
            "base": recipe.base_hash,
            "packages": list(recipe.packages),
            "versions": _installed_versions(tree, recipe.packages),
            "agent": agent,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "image": image_store.image_record(image),
        }
        (staging / image_store.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(tree)
        _put_in_place(staging, final, progress)
    progress(f"image {recipe.hash} ready in {time.monotonic() - started:.1f} s: {final}")
    _mention_other_images(images, recipe.hash, progress)


def _mention_other_images(images: Path, current: str, progress: Progress) -> None:
    """Say what the images of other recipes take: nothing removes them on its own (the
    cache cannot know that no server or session of another checkout uses them)."""
    sizes = []
    for path in images.iterdir():
        if IMAGE_NAME.fullmatch(path.name) and path.name != current:
            with contextlib.suppress(OSError):
                sizes.append((path / image_store.IMAGE_FILE).stat().st_size)
    if sizes:
        progress(f"{len(sizes)} images of other recipes take {sum(sizes) / 2**30:.1f} GiB in "
                 f"{images}: `deskbox image prune` removes those no session uses")


def _put_in_place(staging: Path, final: Path, progress: Progress) -> None:
    """Rename the built ``staging`` to ``final``. An image there already (one that
    ``--rebuild`` replaces, or what a removal by hand left: its mounted, read-only rootfs/)
    is unmounted and removed first, with the OCI images made from its files; renaming onto
    it failed (ENOTEMPTY)."""
    if not final.exists():
        os.rename(staging, final)
        return
    progress(f"image {final.name}: replacing the cached one")
    aside = Path(tempfile.mkdtemp(prefix=f".replaced-{final.name}-", dir=final.parent))
    # Lazily: it goes whatever uses it. A session that runs on it keeps its own mount.
    image_store.retire(final, aside, lazy=True)
    os.rename(staging, final)
    # A VM guest holds no file of the image, only a link to it by name, which the new image
    # answers; an OCI image is a copy of its files.
    for made in made_from(final.parent, final.name):
        if made.name.startswith("oci-"):
            progress(f"  removing {made.name}, made from the replaced image")
            shutil.rmtree(made)
    shutil.rmtree(aside)


# What is made from a session image, beside it: the name's prefix, and the keys in its
# manifest.json that lead to the image's hash (vm_guest.py, oci_image.py).
MADE_FROM_IMAGE = {"vm-": ("rootfs", "image_hash"), "oci-": ("image_hash",)}


def made_from(images: Path, image_hash: str) -> list[Path]:
    """The VM guests and OCI images in ``images`` made from the image ``image_hash``."""
    found = []
    for prefix, keys in MADE_FROM_IMAGE.items():
        for directory in sorted(images.glob(f"{prefix}*")):
            if _manifest_value(directory / "manifest.json", keys) == image_hash:
                found.append(directory)
    return found


def _manifest_value(manifest: Path, keys: tuple[str, ...]) -> object:
    """The value at ``keys`` in the JSON file ``manifest``; None if it has none."""
    try:
        value: object = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _install_agent(
    images: Path, staging: Path, tree: Path, recipe: Recipe, progress: Progress
) -> dict[str, object]:
    """The agent and its wheels into ``tree``; what manifest.json records of them."""
    started = time.monotonic()
    target = agent_install.image_target(tree, _installed_versions(tree, ("python3", "libc6")))
    progress(f"image {recipe.hash}: installing deskbox-agent into /{agent_install.AGENT_DIR} "
             f"(Python {target.python_version}, glibc {target.glibc[0]}.{target.glibc[1]})")
    requirements = staging / "requirements.txt"
    requirements.write_bytes(recipe.requirements)
    # Beside images/, so that removing an image (or all of them) keeps the downloads.
    cache = images.parent / "wheels"
    agent_install.fetch_wheels(requirements, cache, target, progress)
    installed = agent_install.install(
        tree, requirements, cache, recipe.agent, target, progress
    )
    progress(f"  {len(installed)} wheels and {len(recipe.agent)} agent files installed in "
             f"{time.monotonic() - started:.1f} s")
    return {
        "python": target.python_version,
        "wheels": installed,
        "package_files": len(recipe.agent),
    }


def _ensure_base(images: Path, recipe: Recipe, progress: Progress) -> Path:
    final = images / f"base-{recipe.base_hash}"
    if (final / "rootfs").is_dir():
        return final / "rootfs"
    started = time.monotonic()
    progress(f"base {recipe.base_hash}: running mmdebstrap ({len(recipe.packages)} packages)")
    with _staging(images, f"base-{recipe.base_hash}") as staging:
        argv = _verbose(recipe.mmdebstrap_argv(staging / "rootfs"))
        # A session of its own, so that a terminal's Ctrl-C reaches only this script, which
        # stops the whole of mmdebstrap (apt, dpkg) before removing its chroot; and it gets
        # SIGTERM if this script is killed outright.
        with subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True, preexec_fn=_die_with_parent,
        ) as process:
            assert process.stdout is not None
            tail: list[str] = []
            try:
                for line in process.stdout:
                    line = line.rstrip()
                    progress(f"  mmdebstrap: {line}")
                    tail = (tail + [line])[-20:]
                process.wait()
            except BaseException:
                _stop_session(process)
                raise
        if process.returncode != 0:
            raise RuntimeError(
                f"mmdebstrap failed with {process.returncode}:\n" + "\n".join(tail)
            )
        os.rename(staging, final)
    progress(f"base {recipe.base_hash} built in {time.monotonic() - started:.0f} s")
    return final / "rootfs"


def _verbose(argv: list[str]) -> list[str]:
    """mmdebstrap's command line with --verbose: apt's and dpkg's lines as they come. Without
    it, mmdebstrap draws a progress bar on a terminal only, and into our pipe it writes
    nothing for the minutes that the packages install. Kept out of mmdebstrap_argv, whose
    hash names the base: what it says is no part of what it builds."""
    program, *options = argv
    return [program, "--verbose", *options]


def made_from_image(ensure: Callable[[Path, Progress], Path], state_dir: Path) -> int:
    """A script's run of ``ensure`` (what it builds from the session image): progress on
    stderr, the made path on stdout (exit status 0), or why the session image cannot be
    used (INTEGRITY_FAILED)."""

    signal.signal(signal.SIGTERM, _interrupt)
    _stop_with_parent()
    try:
        made = ensure(state_dir, _progress)
    except KeyboardInterrupt:
        _progress("image build interrupted: the unfinished build was removed")
        return 130
    except image_store.ImageIntegrityError as error:
        _progress(f"error: {error}; {integrity_advice(state_dir)}")
        return INTEGRITY_FAILED
    print(made)
    return 0


def _progress(line: str) -> None:
    """A build's progress, on stderr. Once nobody reads it (whoever ran the build was
    killed), the build goes on to its end or its clean-up without saying so: a write that
    raised there would cut the clean-up short."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def integrity_advice(state_dir: Path) -> str:
    """What to run when the cached image fails its integrity check: the commands, as typed."""
    where = shlex.quote(str(state_dir))
    return (f"`deskbox image verify --state-dir {where}` lists every difference; "
            f"`deskbox image build --state-dir {where} --rebuild` builds the image again "
            "and replaces it")


def cached_or_built(
    final: Path, marker: str, label: str, make: Callable[[], None], progress: Progress
) -> Path:
    """``final``, an image directory beside the session image that is complete once it
    holds ``marker``: found, or made by ``make`` under a lock of its kind (``label``), so
    that a second build of it waits for the first and then finds it."""
    if (final / marker).is_file():
        progress(f"{label} {final.name} is cached")
        return final
    with _locked(final.parent / f".{label.replace(' ', '-')}.lock", progress):
        if not (final / marker).is_file():  # else built while we waited
            make()
    return final


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(sig: int = signal.SIGTERM) -> None:
    """``sig`` to the calling process when its parent dies (PR_SET_PDEATHSIG): SIGTERM in
    mmdebstrap's child before exec, SIGHUP in a build script (:func:`_stop_with_parent`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def _stop_with_parent() -> None:
    """Stop this build, as Ctrl-C does, when the process that ran it dies: a `deskbox image
    build` or a server killed with SIGKILL left it building on unseen, holding the cache's
    lock, with mmdebstrap under it. SIGHUP, not a stop signal: the kernel sends it again as
    each thread of the dead parent ends (the orphan passes from thread to thread), and
    stop signals after the first cut a stop short."""
    parent = os.getppid()
    signal.signal(signal.SIGHUP, _parent_died)
    _die_with_parent(signal.SIGHUP)
    if os.getppid() != parent:  # it died before the signal was asked for
        os.kill(os.getpid(), signal.SIGHUP)


def _parent_died(signum: int, frame: object) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # once
    if signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        return  # a stop is under way already (its stop signals are held meanwhile)
    raise KeyboardInterrupt


# What stops a build: Ctrl-C, and SIGTERM, which main() turns into the same KeyboardInterrupt.
_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
_GROUP_POLL_S = 0.1


def _stop_session(
    process: subprocess.Popen[str], grace_s: float = 10.0, kill_wait_s: float = 30.0
) -> None:
    """SIGTERM to every process of ``process``'s session (its own process group), SIGKILL
    to those left after ``grace_s`` or at the next Ctrl-C or SIGTERM; returns once none of
    them runs (or, if SIGKILL cannot end them, ``kill_wait_s`` later).

    Those signals are held meanwhile and only cut the grace short: a second Ctrl-C that
    unwound this wait left mmdebstrap running, with its chroot's mounts. The group, not
    ``process`` alone: a child that outlives mmdebstrap (its progress reader ignores
    SIGTERM) would run on with nobody to stop it."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        _signal_group(process.pid, signal.SIGTERM)
        if not _wait_group(process.pid, grace_s, until_signal=True):
            _signal_group(process.pid, signal.SIGKILL)
            _wait_group(process.pid, kill_wait_s, until_signal=False)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_group(pgid: int, timeout_s: float, until_signal: bool) -> bool:
    """Whether every process of the group ``pgid`` has ended within ``timeout_s``; with
    ``until_signal``, False as soon as a stop signal comes (held, it is taken here)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not _group_runs(pgid):
            return True
        signalled = signal.sigtimedwait(_STOP_SIGNALS, _GROUP_POLL_S) is not None
        if (signalled and until_signal) or time.monotonic() > deadline:
            return False


def _group_runs(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` runs; a zombie does not (orphans are left
    for init to reap, which it may do late)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            state, _ppid, group = stat_file.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        if group == str(pgid) and state != "Z":
            return True
    return False


@contextlib.contextmanager
def _staging(images: Path, name: str) -> Iterator[Path]:
    """A temporary directory next to the final one; removed unless renamed away. Called
    under the images' lock, so what is left of an earlier build of ``name`` (a killed one)
    is removed first."""
    for stale in images.glob(f".building-{name}-*"):
        _remove_staging(stale)
    staging = Path(tempfile.mkdtemp(prefix=f".building-{name}-", dir=images))
    staging.chmod(0o755)  # apt downloads as _apt and must reach the target
    try:
        yield staging
    finally:
        if staging.exists():
            _remove_staging(staging)


def _remove_staging(staging: Path) -> None:
    """Unmount what an interrupted mmdebstrap left mounted in its chroot (/proc, /sys,
    /dev/pts, /dev/shm), then remove the directory: a removal that walked into those
    mounts would fail on their files and leave them behind, mounted, for good. Ctrl-C and
    SIGTERM are held meanwhile: one more of them, cutting it short, left those mounts."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        for point in _mounts_under(staging):
            # Lazy: a mount some process still uses leaves the tree now, goes when it is done.
            subprocess.run(["umount", "--lazy", point], stdin=subprocess.DEVNULL,
                           capture_output=True, check=False)
        shutil.rmtree(staging, ignore_errors=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _mounts_under(directory: Path) -> list[str]:
    """The mount points at or below ``directory``, deepest first."""
    top = str(directory.resolve())
    points = [point for point, _ in image_store.mount_table()
              if point == top or point.startswith(top + "/")]
    return sorted(points, key=lambda point: point.count("/"), reverse=True)


@contextlib.contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("another build is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _replace_file(path: Path, content: bytes, mode: int) -> None:
    """Write a new inode (never through a hard link shared with the base image)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.write_bytes(content)
    path.chmod(mode)


def _installed_versions(rootfs: Path, packages: tuple[str, ...]) -> dict[str, str]:
    """Versions of ``packages`` from the image's dpkg database (read, never executed)."""
    wanted = set(packages)
    versions: dict[str, str] = {}
    status = (rootfs / "var/lib/dpkg/status").read_text(errors="replace")
    for stanza in status.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if fields.get("Package") in wanted:
            versions[fields["Package"]] = fields.get("Version", "?")
    return versions


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state-dir", type=Path,
        default=Path(os.environ.get("DESKBOX_STATE_DIR", RECIPE_DIR.parent / ".state")),
    )
    parser.add_argument("--print-hash", action="store_true", help="print the recipe hash only")
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--verify", action="store_true",
        help="compare every file of the built image with its content manifest",
    )
    what.add_argument(
        "--rebuild", action="store_true",
        help="build the image even if cached, and replace it (one that fails its check)",
    )
    args = parser.parse_args(argv)
    recipe = load_recipe()
    if args.print_hash:
        print(recipe.hash)
        return 0

    progress = _progress
    final = image_dir(args.state_dir.resolve(), recipe)
    if args.verify:
        if not (final / image_store.IMAGE_FILE).is_file():
            progress(f"image {recipe.hash} is not built in {final.parent}")
            return 2
        problems = image_store.verify(final, progress)
        for problem in problems:
            print(problem)
        progress(f"image {recipe.hash}: " + (f"{len(problems)} differences" if problems
                                            else "every file matches its build"))
        return 1 if problems else 0
    # A stop (SIGTERM) unwinds like Ctrl-C, so that an unfinished build is removed.
    signal.signal(signal.SIGTERM, _interrupt)
    _stop_with_parent()
    try:
        rootfs = ensure_image(args.state_dir.resolve(), recipe, progress, args.rebuild)
    except KeyboardInterrupt:
        progress("image build interrupted: the unfinished build was removed")
        return 130
    except image_store.ImageIntegrityError as error:
        progress(f"error: {error}; {integrity_advice(args.state_dir.resolve())}")
        return INTEGRITY_FAILED
    print(rootfs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
