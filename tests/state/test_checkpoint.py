"""CRIU checkpoint and restore of a sandbox (engines/runc/criu.py), below the API.

The machinery is checked on a sandbox without a browser, the quickest to dump (the API's
tests hibernate, snapshot and fork desktops with one): Xvfb and openbox are checkpointed (their
processes and cgroups gone, the images compressed, mode 0600), restored, and the X server
is the same one (the clipboard text its agent owned before is still there, the screen is
pixel-identical), read through the sandbox's agent, reachable again after the restore.
"""

from __future__ import annotations

import asyncio
import stat
import subprocess
from pathlib import Path

import pytest

from deskbox_server.engines.runc.criu import (
    Criu,
    hibernate_sandbox,
    restore_sandbox,
)
from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import ClipboardText

from ..api.test_container import cgroup_dirs
from ..sandbox_agent import agent_desktop

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]


def screen_and_mark(sandbox: RuncSandbox, mark: str | None) -> tuple[bytes, str]:
    """The screen's pixels and the clipboard's text (set to ``mark`` first), through a
    connection of our own to the sandbox's agent, closed again (CRIU cannot dump it)."""

    async def read() -> tuple[bytes, str]:
        async with agent_desktop(sandbox) as desktop:
            if mark is not None:
                await desktop.run([a.ClipboardSet(text=mark)])
            found = (await desktop.run([a.ClipboardGet()])).results[0]
            frame = await desktop.grab()
        assert isinstance(found, ClipboardText)
        return frame.pixels.tobytes(), found.text

    return asyncio.run(read())


def cgroups_inside(sandbox: RuncSandbox) -> set[str]:
    """The cgroup paths the sandbox's init and a new process in it see (their namespace)."""
    done = subprocess.run(
        [*sandbox.options.runc.command(), "exec", sandbox.container_id,
         "cat", "/proc/1/cgroup", "/proc/self/cgroup"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False,
    )
    assert done.returncode == 0, done.stderr
    return {line.split(":", 2)[2] for line in done.stdout.splitlines()}


def cpu_quota_us(container_id: str) -> int:
    return int((Path("/sys/fs/cgroup/cpu") / container_id / "cpu.cfs_quota_us").read_text())


def test_hibernate_and_restore_a_sandbox(sandbox: RuncSandbox) -> None:
    assert cgroups_inside(sandbox) == {"/"}
    # Started at the host's full CPU; the session's own quota (1 CPU) once ready, as the
    # engine does. A restore made the cgroup from config.json, which still held the
    # start-up's quota: a resumed session ran at the host's full CPU.
    sandbox.apply_limits()
    assert cpu_quota_us(sandbox.container_id) == 100_000
    before, mark = screen_and_mark(sandbox, "set before the checkpoint")
    assert mark == "set before the checkpoint"
    container_id = sandbox.container_id

    stats = hibernate_sandbox(sandbox, Criu())
    sandbox.release_init()
    assert Runc().state(container_id) is None
    assert not cgroup_dirs(container_id)  # its memory is released
    archive = sandbox.hibernate_archive
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
    assert cpu_quota_us(container_id) == 100_000
    assert sandbox.init_pid is not None
    status = Path(f"/proc/{sandbox.init_pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(SANDBOX_USER_IDS[0])] * 4
    after, mark = screen_and_mark(sandbox, None)
    assert mark == "set before the checkpoint"
    assert after == before
