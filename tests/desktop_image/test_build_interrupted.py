"""An image build that is stopped part-way (Ctrl-C during the first `make run`, a server
stopped while it builds) leaves nothing mounted and no half-built directory.

mmdebstrap mounts /proc, /sys, /dev/pts and /dev/shm inside its chroot and, killed, leaves
them mounted; a removal that walks into them fails there and keeps the directory. The
mounts here are real (root); the last test stands a small program in for mmdebstrap, which
mounts the way it does and then waits, so that build.py itself is what gets stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import RECIPE


def mounts_under(directory: Path) -> list[str]:
    top = str(directory.resolve())
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(top + "/")]


def mount_like_mmdebstrap(rootfs: Path, host_dir: Path) -> None:
    """The chroot's kernel file systems, and a bind mount of ``host_dir`` (whose files a
    careless removal would delete on the host)."""
    for kind, relative in (("proc", "proc"), ("sysfs", "sys"), ("tmpfs", "dev/shm")):
        (rootfs / relative).mkdir(parents=True)
        subprocess.run(["mount", "-t", kind, kind, str(rootfs / relative)], check=True)
    (rootfs / "host").mkdir()
    subprocess.run(["mount", "--bind", str(host_dir), str(rootfs / "host")], check=True)


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "host-files"
    directory.mkdir()
    (directory / "keep-me").write_text("the host's")
    return directory


def test_an_interrupted_build_unmounts_its_chroot_and_removes_it(
    build: ModuleType, tmp_path: Path, host_dir: Path
) -> None:
    images = tmp_path / "images"
    images.mkdir()
    with pytest.raises(KeyboardInterrupt), build._staging(images, "base-x") as staging:
        mount_like_mmdebstrap(staging / "rootfs", host_dir)
        assert len(mounts_under(images)) == 4
        raise KeyboardInterrupt
    assert mounts_under(images) == []
    assert list(images.iterdir()) == []
    assert (host_dir / "keep-me").read_text() == "the host's"


def test_the_next_build_removes_what_a_killed_one_left(
    build: ModuleType, tmp_path: Path, host_dir: Path
) -> None:
    images = tmp_path / "images"
    killed = images / ".building-base-x-killed"
    mount_like_mmdebstrap(killed / "rootfs", host_dir)
    other = images / ".building-base-y-elsewhere"  # another stage's: not this build's to touch
    other.mkdir()
    with build._staging(images, "base-x") as staging:
        assert not killed.exists()
        assert mounts_under(images) == []
        assert other.is_dir() and staging.is_dir()
    assert sorted(p.name for p in images.iterdir()) == [other.name]
    assert (host_dir / "keep-me").read_text() == "the host's"


FAKE_MMDEBSTRAP = """\
#!{python}
import os, subprocess, sys, time
target = sys.argv[sys.argv.index({suite!r}) + 1]
for kind, relative in (("proc", "proc"), ("tmpfs", "dev/shm")):
    os.makedirs(os.path.join(target, relative))
    subprocess.run(["mount", "-t", kind, kind, os.path.join(target, relative)], check=True)
# What apt and dpkg would be: a child in mmdebstrap's process group.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
print("I: installing remaining packages inside the chroot...", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("stop", ["Ctrl-C to the terminal's process group",
                                  "SIGTERM to the build"])
def test_a_stopped_build_stops_mmdebstrap_and_leaves_nothing(
    build: ModuleType, tmp_path: Path, stop: str
) -> None:
    marker = f"deskbox-fake-apt-{tmp_path.name}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mmdebstrap"
    fake.write_text(FAKE_MMDEBSTRAP.format(python=sys.executable, suite=build.SUITE,
                                           marker=marker))
    fake.chmod(0o755)
    state = tmp_path / "state"
    with subprocess.Popen(
        [sys.executable, str(RECIPE / "build.py"), "--state-dir", str(state)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,  # its own group, as a terminal gives a command
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    ) as process:
        assert process.stderr is not None
        try:
            lines = []
            for line in process.stderr:
                lines.append(line)
                if "installing remaining packages" in line:
                    break
            else:
                pytest.fail("the build never reached mmdebstrap:\n" + "".join(lines))
            assert len(mounts_under(state)) == 2
            if stop.startswith("Ctrl-C"):
                os.killpg(process.pid, signal.SIGINT)
            else:
                process.send_signal(signal.SIGTERM)
            rest = process.stderr.read()
            assert process.wait(30) == 130, rest
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert "image build interrupted: the unfinished build was removed" in rest
    assert "Traceback" not in rest
    assert mounts_under(state) == []
    images = state / "images"
    assert not [p for p in images.iterdir() if p.name.startswith(".building-")]
    deadline = time.monotonic() + 5
    while any(marker in cmdline for cmdline in _cmdlines()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(marker in cmdline for cmdline in _cmdlines()), "mmdebstrap's child lives on"


def _cmdlines() -> list[str]:
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # exited meanwhile
    return found
