"""An image build shows mmdebstrap's progress as it comes: each package apt fetches and dpkg
sets up, not minutes of silence between mmdebstrap's own few lines.

mmdebstrap (1.3) draws a progress bar only on a terminal, and into a pipe (the build reads
its output from one) it writes apt's and dpkg's lines only when told --verbose. A small
program stands in for it here, saying what it says in either case.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

FAKE_MMDEBSTRAP = """\
#!{python}
import os, sys, time
target = sys.argv[sys.argv.index({suite!r}) + 1]
def say(line):
    print(line, file=sys.stderr, flush=True)
say("I: installing remaining packages inside the chroot...")
if "--verbose" in sys.argv:
    say("Setting up xvfb (2:21.1.7-3+deb12u10) ...")
    # The next line only once the build has shown this one: shown as it came.
    deadline = time.monotonic() + 30
    while not os.path.exists({shown!r}):
        if time.monotonic() > deadline:
            say("E: the build did not show the line it was given")
            sys.exit(1)
        time.sleep(0.05)
    say("Setting up openbox (3.6.1-10) ...")
os.makedirs(os.path.join(target, "etc"))
say("I: success in 0.0100 seconds")
"""


def test_the_build_shows_each_package_as_mmdebstrap_sets_it_up(
    build: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown = tmp_path / "shown"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mmdebstrap"
    fake.write_text(FAKE_MMDEBSTRAP.format(python=sys.executable, suite=build.SUITE,
                                           shown=str(shown)))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    images = tmp_path / "images"
    images.mkdir()
    lines: list[str] = []

    def progress(line: str) -> None:
        lines.append(line)
        if "Setting up xvfb" in line:
            shown.touch()

    recipe = build.Recipe(packages=("openbox", "xvfb"), overlay=(), script=b"")
    rootfs = build._ensure_base(images, recipe, progress)
    assert rootfs == images / f"base-{recipe.base_hash}" / "rootfs" and rootfs.is_dir()
    assert [line for line in lines if "mmdebstrap:" in line] == [
        "  mmdebstrap: I: installing remaining packages inside the chroot...",
        "  mmdebstrap: Setting up xvfb (2:21.1.7-3+deb12u10) ...",
        "  mmdebstrap: Setting up openbox (3.6.1-10) ...",
        "  mmdebstrap: I: success in 0.0100 seconds",
    ]
