"""A checkpoint in flight ends with its sandbox, and no CRIU runs past its deadline
(engines/runc/criu_runs.py).

A delete that came while CRIU dumped a sandbox once left the two waiting on each other for
ever (the dumped processes, killed, could only be reaped by CRIU, which waited for them):
the delete failed, the fork never answered, and runc and CRIU outlived the server. A CRIU
that never answers stands in for that here: it needs no luck to show the same hang.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.criu_runs import CriuDeadline, CriuRuns
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.engines.runc.snapshot import take_snapshot
from deskbox_server.errors import DeskboxError

pytestmark = pytest.mark.slow


def running(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True,
                           check=False)
    return found.stdout.split()


def stuck_criu(directory: Path) -> Criu:
    """A CRIU that never answers runc (as the real one did, waiting for what it dumped)."""
    wrapper = directory / "criu-that-hangs"
    wrapper.write_text('#!/bin/sh\nexec tail -f /dev/null "$0"\n')  # "$0": found by name
    wrapper.chmod(0o755)
    return Criu(wrapper)


def test_destroying_a_sandbox_ends_its_checkpoint_in_flight(
    sandbox: RuncSandbox, tmp_path: Path
) -> None:
    criu = stuck_criu(tmp_path)
    outcome: list[BaseException | None] = []

    def checkpoint() -> None:
        try:
            take_snapshot(sandbox, criu, tmp_path / "snapshot", packed=False)
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - what the checkpoint ended with
            outcome.append(error)

    thread = threading.Thread(target=checkpoint)
    thread.start()
    deadline = time.monotonic() + 20
    while not running(str(criu.wrapper)):
        assert time.monotonic() < deadline, "runc never started the CRIU"
        time.sleep(0.05)

    started = time.monotonic()
    sandbox.destroy()
    thread.join(20)
    assert not thread.is_alive(), "the checkpoint did not end with its sandbox"
    assert time.monotonic() - started < 15
    [error] = outcome
    assert isinstance(error, DeskboxError), error  # it failed, and says so
    assert running(str(criu.wrapper)) == []
    assert running(f"checkpoint --leave-running.*{sandbox.container_id}") == []
    assert not (tmp_path / "snapshot").exists()  # nothing of it is left


def test_a_criu_run_past_its_deadline_is_killed_with_all_it_started(tmp_path: Path) -> None:
    marker = f"sleep 601 # {tmp_path}"
    command = ["sh", "-c", f"sh -c '{marker}' & sh -c '{marker}'; wait"]
    started = time.monotonic()
    with pytest.raises(CriuDeadline) as raised:
        CriuRuns().run(command, "checkpoint", deadline_s=0.5)
    assert time.monotonic() - started < 5
    assert "did not finish the checkpoint within 0.5 s" in raised.value.message
    assert running(marker) == []  # the command's children too


def test_an_ended_sandbox_starts_no_criu() -> None:
    runs = CriuRuns()
    runs.end()
    with pytest.raises(DeskboxError) as raised:
        runs.run(["true"], "restore")
    assert "being removed" in raised.value.message
