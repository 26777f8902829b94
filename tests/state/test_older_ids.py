"""Checkpoints taken while the sandboxes ran as the host's ids 100000-165535 (before they
moved out of Debian's /etc/subuid range: engines/runc/layout.py) still restore. CRIU gives
the restored processes the user namespace it dumped, so their host side must let those ids
in: the shared tmpfs was made for today's ids, and the restore failed in CRIU ("mnt-v2:
Failed to open_tree .../x11: Permission denied")."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.runc.criu import Criu, hibernate_sandbox, restore_sandbox
from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox
from deskbox_server.engines.runc.snapshot import restore_copy, take_snapshot
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import ClipboardText

from ..images import session_image
from ..sandbox_agent import agent_desktop, until_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

OLDER_IDS = (100_000, 65_536)


@pytest.fixture
def today(tmp_path: Path) -> RuncOptions:
    return RuncOptions(state_dir=tmp_path / "state", rootfs=session_image(),
                       id_prefix="deskbox-ids-")


@pytest.fixture
def older(today: RuncOptions) -> Iterator[RuncSandbox]:
    """A sandbox started as an earlier server started them, its clipboard marked."""
    assert SANDBOX_USER_IDS[0] != OLDER_IDS[0]
    box = RuncSandbox.start(dataclasses.replace(today, user_ids=OLDER_IDS),
                            f"o{os.getpid()}", browser=False)
    try:
        until_ready(box, browser=False)
        assert clipboard(box, "kept") == "kept"
        yield box
    finally:
        box.destroy()


def clipboard(sandbox: RuncSandbox, mark: str | None = None) -> str:
    """The clipboard's text (set to ``mark`` first), through the sandbox's agent."""

    async def read() -> str:
        async with agent_desktop(sandbox) as desktop:
            if mark is not None:
                await desktop.run([a.ClipboardSet(text=mark)])
            found = (await desktop.run([a.ClipboardGet()])).results[0]
        assert isinstance(found, ClipboardText)
        return found.text

    return asyncio.run(read())


def host_uid(sandbox: RuncSandbox) -> int:
    assert sandbox.init_pid is not None
    status = Path(f"/proc/{sandbox.init_pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_a_copy_of_an_older_snapshot_runs_as_its_ids(
    older: RuncSandbox, today: RuncOptions, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    take_snapshot(older, Criu(), tmp_path / "snapshot", packed=True)
    with caplog.at_level(logging.WARNING, logger="deskbox.runc"):
        copy = restore_copy(today, f"c{os.getpid()}", tmp_path / "snapshot", Criu())
    try:
        assert host_uid(copy) == OLDER_IDS[0]
        assert clipboard(copy) == "kept"
        assert any("100000-165535" in record.getMessage() for record in caplog.records), \
            caplog.text
    finally:
        copy.destroy()


def test_an_older_hibernation_resumes_after_a_reboot(
    older: RuncSandbox, today: RuncOptions,
) -> None:
    """Hibernated by an earlier server, whose host side is gone (as after a reboot), then
    taken over and resumed by today's."""
    older.pin_inner_display()
    hibernate_sandbox(older, Criu())
    older.release_init()
    older.release_host_side()
    resumed = RuncSandbox.adopt_checkpointed(today, older.session_id)
    try:
        restore_sandbox(resumed, Criu())
        assert host_uid(resumed) == OLDER_IDS[0]
        assert clipboard(resumed) == "kept"
    finally:
        resumed.destroy()
