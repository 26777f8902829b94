"""The session image: a build script of ``desktop_image/`` run as a subprocess, its progress
relayed (``build.py``: the root filesystem; ``vm_guest.py``: the VM guest made from it;
``oci_image.py``: the OCI image made from it; ``prune.py``: what the cache holds of other
recipes, removed).

The build is cached by recipe hash under ``<image_state_dir>/images/`` (a cached image is
found in ~0.1 s; a cold build takes minutes). The server (each engine's ``prepare``) and
the test suites call :func:`build_image` alike, so they find the same cache.
Blocking: call it off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import Internal

__all__ = [
    "OCI_ARCHIVE", "ImageHold", "Pruned", "build_image", "build_off_loop", "describe_images",
    "prune_images", "verify_image",
]

Progress = Callable[[str], None]
_TAIL_LINES = 20
_STOP_GRACE_S = 20.0  # build.py's own grace for mmdebstrap is 10 s
# build.py's exit status when the cached image fails its start-up integrity check.
_INTEGRITY_FAILED = 4
OCI_ARCHIVE = "deskbox-session.oci.tar"  # in oci_image.py's directory (its ARCHIVE)


def build_image(
    image_state_dir: Path,
    recipe_dir: Path,
    progress: Progress,
    timeout_s: float = 3600.0,
    cancel: threading.Event | None = None,
    script_name: str = "build.py",
    rebuild: bool = False,
) -> Path:
    """What ``script_name`` of ``recipe_dir`` builds (``build.py``: the root filesystem),
    built first if the cache lacks it; the path its last line of output names.

    Every line the build writes to stderr goes to ``progress`` as it comes. Setting
    ``cancel`` (or ``timeout_s`` passing) kills the build. ``rebuild`` (build.py only):
    build the image even if cached, and replace the cached one.
    """
    script = recipe_dir / script_name
    if not script.is_file():
        raise Internal(
            f"the session image recipe {script} is missing: set DESKBOX_RECIPE_DIR to the "
            "desktop_image/ directory of a Deskbox source tree"
        )
    images = _usable_cache(image_state_dir)
    tail: list[str] = []
    out: list[str] = []
    stopped: list[str] = []
    done = threading.Event()
    with subprocess.Popen(
        [sys.executable, str(script), "--state-dir", str(image_state_dir),
         *(["--rebuild"] if rebuild else [])],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, errors="replace",
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        stdout = process.stdout
        reader = threading.Thread(
            target=lambda: out.append(stdout.read()), name="image-build-stdout", daemon=True
        )
        reader.start()

        def watch() -> None:
            deadline = time.monotonic() + timeout_s
            while not done.wait(0.2):
                if cancel is not None and cancel.is_set():
                    stopped.append("was cancelled")
                elif time.monotonic() > deadline:
                    stopped.append(f"took over {timeout_s:.0f} s")
                else:
                    continue
                # build.py stops mmdebstrap and removes the unfinished build on SIGTERM.
                process.terminate()
                try:
                    process.wait(_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                return

        watchdog = threading.Thread(target=watch, name="image-build-watch", daemon=True)
        watchdog.start()
        try:
            for line in process.stderr:
                line = line.rstrip()
                tail.append(line)
                del tail[:-_TAIL_LINES]
                progress(line)
            process.wait()
        finally:
            done.set()
            watchdog.join()
            reader.join()
    if stopped:
        raise Internal(f"building the session image {stopped[0]}")
    stdout_text = "".join(out)
    lines = stdout_text.strip().splitlines()
    if process.returncode == _INTEGRITY_FAILED:
        raise Internal(
            "the session image failed its integrity check; no session starts from it:\n"
            + "\n".join(tail)
        )
    if process.returncode != 0 and not os.access(images, os.W_OK):
        # Its last lines are a PermissionError's traceback (its lock file), said plainly.
        raise Internal(f"the image cache {images} cannot be written, and this image is not "
                       f"built there ({_CACHE_SETTING})")
    if process.returncode != 0 or not lines:
        detail = "\n".join(tail) or "no output"
        raise Internal(f"building the session image failed ({process.returncode}):\n{detail}")
    built = Path(lines[-1])
    if not built.is_dir():
        raise Internal(f"the image build reported {built}, which is not a directory")
    return built


_CACHE_SETTING = "DESKBOX_IMAGE_STATE_DIR, or deskbox image --state-dir"


def _usable_cache(image_state_dir: Path) -> Path:
    """The cache's images/ directory, made if missing; Internal in one line if it cannot be
    (a path through a file, another user's directory): the build script's traceback
    through pathlib's mkdir said it before, twice. Checked here, not in the script, whose
    every byte is part of the recipe's hash (a change rebuilds every image)."""
    images = image_state_dir / "images"
    try:
        images.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise Internal(f"the image cache {images} cannot be made: {error.strerror} "
                       f"({_CACHE_SETTING})") from None
    return images


class ImageHold:
    """A descriptor kept open on the image an engine serves from, for as long as the server
    runs. ``deskbox image prune`` keeps an image that a process holds a file of (or runs
    on), so an idle server of an older recipe, between sessions, is named as its user
    instead of having the image removed from under its next session."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def hold(self, path: Path) -> None:
        """Hold ``path`` (a directory of the mounted image, or the image's file) instead
        of what was held before; OSError if it cannot be opened."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.release()
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def build_off_loop(build: Callable[[threading.Event], Path]) -> Path:
    """``build`` (an engine's image builder) on a thread; a cancelled caller (a server
    stopped during its start) sets the builder's event, so that the build stops too."""
    cancel = threading.Event()
    try:
        return await asyncio.to_thread(build, cancel)
    except asyncio.CancelledError:
        cancel.set()
        raise


def verify_image(image_state_dir: Path, recipe_dir: Path, progress: Progress) -> list[str]:
    """Every difference between the built image of ``recipe_dir`` and its content manifest
    (``build.py --verify``: reads every byte, seconds). Empty when the image is intact;
    Internal if it is not built or cannot be read."""
    done = _run_recipe_script(recipe_dir / "build.py", image_state_dir, ["--verify"],
                              progress, "could not verify the session image")
    return done.stdout.splitlines()


def _run_recipe_script(
    script: Path, image_state_dir: Path, options: list[str], progress: Progress, failed: str,
) -> subprocess.CompletedProcess[str]:
    """One of the recipe's scripts on the cache, its stderr passed to ``progress``: exit
    status 0 or 1 (its answer either way), else Internal with ``failed`` and its stderr."""
    done = subprocess.run(
        [sys.executable, str(script), "--state-dir", str(image_state_dir), *options],
        stdin=subprocess.DEVNULL, capture_output=True, text=True,
        errors="replace", check=False, timeout=3600,
    )
    for line in done.stderr.splitlines():
        progress(line)
    if done.returncode not in (0, 1):
        raise Internal(f"{failed}: {done.stderr.strip()[-2000:]}")
    return done


@dataclass(frozen=True)
class Pruned:
    """What ``prune.py`` said: a line per directory (removed, or kept and why) and the space
    freed; ``complete`` unless an image was kept because it is in use (or not removable)."""

    report: list[str]
    complete: bool


def prune_images(
    image_state_dir: Path, recipe_dir: Path, progress: Progress, dry_run: bool = False
) -> Pruned:
    """Remove from the cache every image but the current one of ``recipe_dir`` (and what was
    made from them) that no process uses (``prune.py``). Internal if it could not run."""
    done = _run_recipe_script(recipe_dir / "prune.py", image_state_dir,
                              ["--dry-run"] if dry_run else [], progress,
                              "could not prune the image cache")
    return Pruned(done.stdout.splitlines(), complete=done.returncode == 0)


def describe_images(image_state_dir: Path, recipe_dir: Path) -> dict[str, object]:
    """What is built of ``recipe_dir``'s current recipe, building nothing: the session
    image's and the OCI image's build manifests (None where not built)."""
    found: dict[str, object] = {}
    for part, argv in (("image", ["build.py", "--print-hash"]),
                       ("oci", ["oci_image.py", "--print-dir"])):
        done = subprocess.run(
            [sys.executable, str(recipe_dir / argv[0]), "--state-dir", str(image_state_dir),
             *argv[1:]],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
            check=False, timeout=120,
        )
        if done.returncode != 0 or not done.stdout.strip():
            raise Internal(f"could not read the recipe {recipe_dir}: {done.stderr.strip()[-2000:]}")
        where = done.stdout.strip().splitlines()[-1]
        directory = image_state_dir / "images" / where if part == "image" else Path(where)
        try:
            found[part] = json.loads((directory / "manifest.json").read_text())
        except FileNotFoundError:
            found[part] = None
        except (OSError, ValueError) as error:
            raise Internal(f"{directory}/manifest.json cannot be read: {error}") from None
    return found
