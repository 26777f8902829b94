"""Install deskbox-agent and its pinned wheels into an image tree, without running the image.

Every step runs on the host and treats the tree as data: the image's Python version and
glibc come from its dpkg database, the bytecode magic number from its standard library's
``.pyc`` files, and nothing under the tree is executed (its programs are not yet used by
any sandbox, but a build that runs none of them needs no chroot and cannot be fooled by
one). In order:

1. :func:`fetch_wheels`: ``pip download`` of ``agent/requirements.txt`` (every line pinned
   with its sha256; ``--only-binary`` and the image's Python and platform tags) into a
   wheel cache under the state directory; a rebuild finds them there and stays offline.
2. :func:`install`: ``pip install --target`` from that cache alone (``--no-index``), with
   the same tags and ``--require-hashes`` (a changed file in the cache is refused), and
   ``--no-compile``; then the agent package (``agent/deskbox_agent/``) is copied beside the
   wheels and everything is byte-compiled by a host Python whose magic number is the
   image's.

The bytecode is ``unchecked-hash``: the root is read-only erofs, so its sources cannot
change under their ``.pyc``, and Python neither stats nor hashes a source to trust it. A
root without ``.pyc`` files would cost every agent start a compile in memory, since the
read-only root cannot take the cache Python tries to write.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.util import MAGIC_NUMBER
from pathlib import Path

__all__ = [
    "AGENT_DIR",
    "AGENT_PACKAGE",
    "ImageTarget",
    "fetch_wheels",
    "image_target",
    "install",
]

AGENT_DIR = "usr/lib/deskbox-agent"  # in the image; /usr/local/bin/deskbox-agent reads it
AGENT_PACKAGE = "deskbox_agent"
_OLDEST_GLIBC_MINOR = 5  # manylinux1
_PIP_TAIL = 4000

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ImageTarget:
    """What the image's wheels must match: its Python, its glibc, its bytecode magic."""

    python: tuple[int, int]
    glibc: tuple[int, int]
    magic: bytes
    machine: str = "x86_64"

    @property
    def python_version(self) -> str:
        return f"{self.python[0]}.{self.python[1]}"

    def pip_args(self) -> list[str]:
        """pip's flags for this image's wheels: only binary CPython wheels of its version,
        for every manylinux tag its glibc can load (pip expands none of them itself)."""
        major, minor = self.glibc
        platforms = [f"manylinux_{major}_{m}_{self.machine}"
                     for m in range(minor, _OLDEST_GLIBC_MINOR - 1, -1)]
        # The legacy aliases that older wheels carry alone (2014 = 2.17, 2010 = 2.12, 1 = 2.5).
        platforms += [f"manylinux{alias}_{self.machine}" for alias in ("2014", "2010", "1")]
        args = ["--only-binary=:all:", "--implementation", "cp",
                "--python-version", self.python_version]
        for platform in platforms:
            args += ["--platform", platform]
        return args


def _debian_version(versions: dict[str, str], package: str) -> tuple[int, int]:
    found = re.match(r"(?:\d+:)?(\d+)\.(\d+)", versions.get(package, ""))
    if found is None:
        raise RuntimeError(f"the image has no readable version of the {package} package")
    return int(found[1]), int(found[2])


def image_target(tree: Path, versions: dict[str, str]) -> ImageTarget:
    """The target of the image ``tree``, whose dpkg versions of ``python3`` and ``libc6``
    are ``versions``; its magic number is read from its standard library's bytecode."""
    python = _debian_version(versions, "python3")
    glibc = _debian_version(versions, "libc6")
    tag = f"cpython-{python[0]}{python[1]}"
    stdlib = tree / f"usr/lib/python{python[0]}.{python[1]}/__pycache__/os.{tag}.pyc"
    try:
        with open(stdlib, "rb") as pyc:
            magic = pyc.read(4)
    except OSError as error:
        raise RuntimeError(f"cannot read the image's bytecode magic number: {error}") from None
    return ImageTarget(python, glibc, magic)


def _pip(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # The build's own Python runs pip (the server's virtualenv has it); the pip
    # configuration of the host applies, as for any download of this machine.
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
        check=False,
    )


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> RuntimeError:
    output = (done.stdout + done.stderr).strip()[-_PIP_TAIL:]
    return RuntimeError(f"{what} failed with {done.returncode}:\n{output}")


def fetch_wheels(
    requirements: Path, cache: Path, target: ImageTarget, progress: Progress
) -> None:
    """Make sure ``cache`` holds every wheel of ``requirements`` for ``target``."""
    cache.mkdir(parents=True, exist_ok=True)
    common = ["download", "--dest", str(cache), "--require-hashes", *target.pip_args(),
              "--requirement", str(requirements)]
    if _pip([*common, "--no-index", "--find-links", str(cache)]).returncode == 0:
        progress(f"  the agent's wheels are cached in {cache}")
        return
    progress(f"  downloading the agent's wheels into {cache}")
    done = _pip(common)
    if done.returncode != 0:
        raise _failed("pip download of the agent's wheels", done)


def _compiler(target: ImageTarget) -> str:
    """A host Python that writes the image's bytecode (same magic number)."""
    if MAGIC_NUMBER == target.magic:
        return sys.executable
    version = target.python_version
    for name in (f"python{version}", f"/usr/bin/python{version}"):
        path = shutil.which(name)
        if path is None:
            continue
        done = subprocess.run(
            [path, "-I", "-c", "import importlib.util as u; print(u.MAGIC_NUMBER.hex())"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        )
        if done.returncode == 0 and done.stdout.strip() == target.magic.hex():
            return path
    raise RuntimeError(
        f"no Python on this host writes the image's bytecode (Python {version}, magic "
        f"{target.magic.hex()}; {sys.executable} writes {MAGIC_NUMBER.hex()}): install "
        f"python{version} on the host"
    )


def install(
    tree: Path,
    requirements: Path,
    cache: Path,
    agent: Sequence[tuple[str, bytes]],
    target: ImageTarget,
    progress: Progress,
) -> list[str]:
    """Install the wheels of ``requirements`` (from ``cache`` only) and the agent package's
    files ``agent`` (relative path, content) into ``tree``/:data:`AGENT_DIR`, compiled.
    Returns the installed distributions as ``name==version``."""
    destination = tree / AGENT_DIR
    if destination.exists():
        raise RuntimeError(f"/{AGENT_DIR} already exists in the base image")
    done = _pip(["install", "--target", str(destination), "--no-index", "--find-links",
                 str(cache), "--require-hashes", "--no-compile", "--root-user-action=ignore",
                 *target.pip_args(), "--requirement", str(requirements)])
    if done.returncode != 0:
        raise _failed("pip install of the agent's wheels", done)
    # Console scripts (numpy's f2py, ...) land in bin/ with the host Python's path in their
    # first line; nothing in the image runs them.
    shutil.rmtree(destination / "bin", ignore_errors=True)
    # The wheels' own test suites (numpy's: 14 directories, 17 MB with their bytecode) are
    # never imported by the agent.
    for tests in sorted(destination.rglob("tests"), reverse=True):
        if tests.is_dir() and not tests.is_symlink():
            shutil.rmtree(tests)
    installed = sorted(
        path.name.removesuffix(".dist-info").replace("-", "==", 1)
        for path in destination.glob("*.dist-info")
    )
    if agent:
        progress(f"  copying the agent package ({len(agent)} files)")
    else:
        progress(f"  no agent package in desktop_image/agent/{AGENT_PACKAGE}/: "
                 "its dependencies only")
    for relative, content in agent:
        path = destination / AGENT_PACKAGE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(0o644)
    compiler = _compiler(target)
    progress(f"  byte-compiling /{AGENT_DIR} for Python {target.python_version} "
             f"with {compiler}")
    # -s/-p: tracebacks name the file where the image has it, not the build's staging path.
    done = subprocess.run(
        [compiler, "-I", "-m", "compileall", "-q", "-j", "0",
         "--invalidation-mode", "unchecked-hash", "-s", str(tree), "-p", "/",
         str(destination)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
        check=False,
    )
    if done.returncode != 0:
        raise _failed(f"byte-compiling /{AGENT_DIR}", done)
    _make_readable(destination)
    return installed


def _make_readable(directory: Path) -> None:
    """Everything readable by all, whatever the umask the build ran with: inside the
    sandbox these files belong to an id it does not map (and the root is read-only)."""
    for parent, _dirs, files in os.walk(directory):
        os.chmod(parent, 0o755)
        for name in files:
            path = os.path.join(parent, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)
