"""CRIU checkpoint and restore of a sandbox (backends/checkpoint.py), below the API.

A desktop with a browser cannot be dumped on this host (Linux ≥ 6.16 with CRIU 4.1.1: see
checkpoint.py; tests/api/test_container_pause.py checks the error names that cause), so the
machinery is checked on a sandbox without one: Xvfb and openbox are checkpointed (their
processes and cgroups gone, the images compressed, mode 0600), restored, and the X server
is the same one (a property set before is still there, the screen is pixel-identical),
reachable again through the republished socket.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from Xlib import X, Xatom
from Xlib import display as xdisplay

from deskbox_server.backends.checkpoint import (
    Criu,
    archive_path,
    hibernate_sandbox,
    restore_sandbox,
)
from deskbox_server.backends.container import ContainerOptions, ContainerSandbox
from deskbox_server.backends.oci import SANDBOX_USER_IDS
from deskbox_server.backends.runc import Runc

from ..api.test_container import cgroup_dirs
from ..images import session_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[ContainerSandbox]:
    options = ContainerOptions(state_dir=tmp_path / "state", rootfs=session_image(),
                               id_prefix="deskbox-ckpt-")
    box = ContainerSandbox.start(options, f"c{os.getpid()}", browser=False)
    try:
        yield box
    finally:
        box.destroy()


def screen_and_mark(display_name: str, mark: bytes | None) -> tuple[bytes, bytes | None]:
    x = xdisplay.Display(display_name)
    try:
        root = x.screen().root
        atom = x.intern_atom("DESKBOX_CHECKPOINT_TEST")
        if mark is not None:
            root.change_property(atom, Xatom.STRING, 8, mark)
            x.sync()
        found = root.get_full_property(atom, Xatom.STRING)
        width, height = x.screen().width_in_pixels, x.screen().height_in_pixels
        pixels = root.get_image(0, 0, width, height, X.ZPixmap, 0xFFFFFFFF).data
        return bytes(pixels), (bytes(found.value) if found is not None else None)
    finally:
        x.close()


def cgroups_inside(sandbox: ContainerSandbox) -> set[str]:
    """The cgroup paths the sandbox's init and a new process in it see (their namespace)."""
    done = subprocess.run(
        [*sandbox.options.runc.command(), "exec", sandbox.container_id,
         "cat", "/proc/1/cgroup", "/proc/self/cgroup"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    return {line.split(":", 2)[2] for line in done.stdout.splitlines()}


def test_hibernate_and_restore_a_sandbox(sandbox: ContainerSandbox) -> None:
    assert cgroups_inside(sandbox) == {"/"}
    before, mark = screen_and_mark(sandbox.display_name, b"set before the checkpoint")
    assert mark == b"set before the checkpoint"
    container_id = sandbox.container_id

    stats = hibernate_sandbox(sandbox, Criu())
    sandbox.release_init()
    assert Runc().state(container_id) is None
    assert not cgroup_dirs(container_id)  # its memory is released
    archive = archive_path(sandbox)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert 0 < stats.compressed_bytes < stats.raw_bytes
    print(f"dump {stats.seconds:.2f} s, {stats.raw_bytes / 2**20:.0f} MiB raw, "
          f"{stats.compressed_bytes / 2**20:.1f} MiB zstd")

    seconds = restore_sandbox(sandbox, Criu())
    print(f"restore {seconds:.2f} s")
    assert sandbox.failure() is None
    state = Runc().state(container_id)
    assert state is not None and state.status == "running"
    assert not archive.exists()
    # Restored into its own cgroup namespace again: no host cgroup path shows inside; and
    # into a user namespace: its root is still an unprivileged user of the host.
    assert cgroups_inside(sandbox) == {"/"}
    assert sandbox.init_pid is not None
    status = Path(f"/proc/{sandbox.init_pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(SANDBOX_USER_IDS[0])] * 4
    after, mark = screen_and_mark(sandbox.display_name, None)
    assert mark == b"set before the checkpoint"
    assert after == before
