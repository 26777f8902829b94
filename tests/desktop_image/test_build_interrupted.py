"""An image build that is stopped part-way (Ctrl-C during the first `make run`, a server
stopped while it builds) leaves nothing mounted and no half-built directory.

mmdebstrap mounts /proc, /sys, /dev/pts and /dev/shm inside its chroot and, killed, leaves
them mounted; a removal that walks into them fails there and keeps the directory. The
mounts here are real (root); the last test stands a small program in for mmdebstrap, which
mounts the way it does and then waits, so that build.py itself is what gets stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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


# mmdebstrap's progress reader, as far as a stop goes: it ignores SIGTERM. It prints its
# argument once it does.
PROGRESS_READER = """\
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(sys.argv[1], flush=True)
time.sleep(300)
"""

# As mmdebstrap while apt or dpkg runs: SIGTERM is noted ("waiting for child...") and it
# waits on, beside its progress reader.
STUBBORN_MMDEBSTRAP = """\
#!{python}
import os, signal, subprocess, sys, time
target = sys.argv[sys.argv.index({suite!r}) + 1]
for kind, relative in (("proc", "proc"), ("tmpfs", "dev/shm")):
    os.makedirs(os.path.join(target, relative))
    subprocess.run(["mount", "-t", kind, kind, os.path.join(target, relative)], check=True)
signal.signal(signal.SIGTERM, lambda *_: open({noted!r}, "w").close())
subprocess.Popen([sys.executable, {reader!r},
                  "I: installing remaining packages inside the chroot..."])
time.sleep(300)
"""


def progress_reader(tmp_path: Path) -> str:
    """The path of a PROGRESS_READER, which marks its process too."""
    reader = tmp_path / "progress-reader.py"
    reader.write_text(PROGRESS_READER)
    return str(reader)


def fake_mmdebstrap(build: ModuleType, bin_dir: Path, template: str, **values: str) -> None:
    bin_dir.mkdir()
    fake = bin_dir / "mmdebstrap"
    fake.write_text(template.format(python=sys.executable, suite=build.SUITE, **values))
    fake.chmod(0o755)


def start_build(state: Path, bin_dir: Path) -> subprocess.Popen[str]:
    """build.py in a session of its own, as a terminal runs a command, once it has started
    mmdebstrap (the one on ``bin_dir``)."""
    process = subprocess.Popen(
        [sys.executable, str(RECIPE / "build.py"), "--state-dir", str(state)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if "installing remaining packages" in line:
            return process
    process.wait()
    pytest.fail("the build never reached mmdebstrap:\n" + "".join(lines))


@pytest.mark.parametrize("stop", ["Ctrl-C to the terminal's process group",
                                  "SIGTERM to the build"])
def test_a_stopped_build_stops_mmdebstrap_and_leaves_nothing(
    build: ModuleType, tmp_path: Path, stop: str
) -> None:
    marker = f"deskbox-fake-apt-{tmp_path.name}"
    bin_dir = tmp_path / "bin"
    fake_mmdebstrap(build, bin_dir, FAKE_MMDEBSTRAP, marker=marker)
    state = tmp_path / "state"
    with start_build(state, bin_dir) as process:
        assert process.stderr is not None
        try:
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
    assert_nothing_left(state, rest, marker)


def test_a_second_ctrl_c_kills_what_the_first_could_not_stop(
    build: ModuleType, tmp_path: Path
) -> None:
    """The second Ctrl-C unwound the wait for mmdebstrap's grace: the build exited and left
    mmdebstrap, which had not ended on SIGTERM, running (and its child)."""
    reader = progress_reader(tmp_path)
    noted = tmp_path / "sigterm-noted"
    bin_dir = tmp_path / "bin"
    fake_mmdebstrap(build, bin_dir, STUBBORN_MMDEBSTRAP, reader=reader, noted=str(noted))
    fake = str(bin_dir / "mmdebstrap")
    state = tmp_path / "state"
    try:
        with start_build(state, bin_dir) as process:
            assert process.stderr is not None
            try:
                os.killpg(process.pid, signal.SIGINT)
                eventually(noted.exists, "mmdebstrap got SIGTERM")
                second = time.monotonic()
                os.killpg(process.pid, signal.SIGINT)
                rest = process.stderr.read()
                assert process.wait(30) == 130, rest
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
        assert time.monotonic() - second < 8  # not the whole grace (10 s): killed at once
        assert_nothing_left(state, rest, fake, reader)
    finally:
        kill_left(fake, reader)


def test_a_stop_waits_for_every_process_of_the_group(build: ModuleType, tmp_path: Path) -> None:
    """mmdebstrap ends on SIGTERM, but its progress reader ignores it: the stop waited for
    mmdebstrap alone and returned with the reader running."""
    reader = progress_reader(tmp_path)
    with subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time\n"
         f"subprocess.Popen([sys.executable, {reader!r}, 'ready'])\ntime.sleep(300)"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, start_new_session=True,
    ) as mmdebstrap:
        assert mmdebstrap.stdout is not None
        try:
            assert mmdebstrap.stdout.readline() == "ready\n"
            build._stop_session(mmdebstrap, grace_s=1)
            assert mmdebstrap.poll() is not None
            assert not left(reader), "the progress reader runs on"
        finally:
            kill_left(reader)


def assert_nothing_left(state: Path, stderr: str, *markers: str) -> None:
    """What a stopped build must leave: its last words, no mount, no directory of the
    unfinished build, no process of mmdebstrap's (by a string of their command lines)."""
    assert "image build interrupted: the unfinished build was removed" in stderr
    assert "Traceback" not in stderr
    assert mounts_under(state) == []
    images = state / "images"
    assert not [p for p in images.iterdir() if p.name.startswith(".building-")]
    deadline = time.monotonic() + 5
    while left(*markers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(*markers), "mmdebstrap or its child lives on"


def left(*markers: str) -> dict[int, str]:
    """The processes whose command lines hold any of ``markers``: pid, command line."""
    return {pid: cmdline for pid, cmdline in _processes().items()
            if any(marker in cmdline for marker in markers)}


def kill_left(*markers: str) -> None:
    """SIGKILL to what a failed test would otherwise leave running for minutes."""
    for pid in left(*markers):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.05)


def _processes() -> dict[int, str]:
    found = {}
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found[int(path.parent.name)] = (
                path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # exited meanwhile
    return found


def test_a_killed_deskbox_image_build_stops_its_build(build: ModuleType, tmp_path: Path) -> None:
    """`deskbox image build` (or a server) killed with SIGKILL while mmdebstrap runs: the
    build script it ran got no signal and built on unseen, holding the cache's lock, with
    mmdebstrap and its children under it."""
    marker = f"deskbox-fake-apt-{tmp_path.name}"
    bin_dir = tmp_path / "bin"
    fake_mmdebstrap(build, bin_dir, FAKE_MMDEBSTRAP, marker=marker)
    state = tmp_path / "state"
    try:
        with subprocess.Popen(
            [str(Path(sys.executable).parent / "deskbox"), "image", "build",
             "--state-dir", str(state)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        ) as command:
            assert command.stderr is not None
            said = []
            for line in command.stderr:
                said.append(line)
                if "installing remaining packages" in line:
                    break
            else:
                pytest.fail("the build never reached mmdebstrap:\n" + "".join(said))
            assert left(marker), "no fake apt under mmdebstrap"
            command.kill()
            command.wait()
        eventually(lambda: not left(marker, str(state)),
                   "the build script, mmdebstrap and its child ended", timeout_s=30)
        assert mounts_under(state) == []
        assert not [p for p in (state / "images").iterdir() if p.name.startswith(".building-")]
    finally:
        kill_left(marker, str(state))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_build_stopped_by_a_burst_of_signals_leaves_nothing(
    build: ModuleType, tmp_path: Path, sig: int
) -> None:
    """Three at once: a dead parent's threads each send SIGHUP as they end (the kernel's
    parent-death signal), an impatient operator sends SIGTERM again. One that came while
    the build removed its chroot cut that short and left its mounts (and SIGHUP, before it
    meant a dead parent, killed the build outright)."""
    marker = f"deskbox-fake-apt-{tmp_path.name}"
    bin_dir = tmp_path / "bin"
    fake_mmdebstrap(build, bin_dir, FAKE_MMDEBSTRAP, marker=marker)
    state = tmp_path / "state"
    try:
        with start_build(state, bin_dir) as process:
            assert process.stderr is not None
            for _ in range(3):
                process.send_signal(sig)
            rest = process.stderr.read()
            assert process.wait(30) == 130, rest
        assert_nothing_left(state, rest, marker)
    finally:
        kill_left(marker, str(state))
