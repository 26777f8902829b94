"""The copies of a fork are let go together (engines/base.py ``StartTogether``): a copy
restored first stays stopped, every one of its processes, until the last copy is restored;
a copy that fails lets the others go at once."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.base import StartTogether
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.freezer import cgroup_procs, task_state
from deskbox_server.engines.runc.sandbox import RuncSandbox
from deskbox_server.engines.runc.snapshot import restore_copy, take_snapshot

pytestmark = pytest.mark.skipif(Criu().missing() is not None,
                                reason="CRIU 4.1 is not installed (scripts/criu.sh)")


@pytest.fixture
def checkpoint(sandbox: RuncSandbox, tmp_path: Path) -> Path:
    """The sandbox's raw images, as a fork takes them."""
    directory = tmp_path / "fork"
    take_snapshot(sandbox, Criu(), directory, packed=False)
    return directory


class CopyInThread:
    """``restore_copy`` on a thread of its own, as the engine runs each copy of a fork."""

    def __init__(self, sandbox: RuncSandbox, checkpoint: Path, name: str,
                 together: StartTogether) -> None:
        self.container_id = sandbox.options.id_prefix + name
        self.together = together
        # Written by `runc restore` once CRIU is done (its tasks stopped, then sealed).
        self.pid_file = (sandbox.options.state_dir.resolve() / "sessions" / name / "bundle"
                         / "init.pid")
        self.copy: RuncSandbox | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.copy = restore_copy(sandbox.options, name, checkpoint, Criu(),
                                         together=together)
            except BaseException as error:  # noqa: BLE001 - reported by the test
                self.error = error

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def states(self) -> list[str | None]:
        try:
            return [task_state(pid) for pid in cgroup_procs(self.container_id)]
        except Exception:  # noqa: BLE001 - no cgroup yet
            return []

    def wait_all_stopped(self, timeout_s: float = 30.0) -> None:
        """Until the copy is restored: every one of its processes stopped (while CRIU
        restores them they run, or stop under its ptrace, "t")."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.states()
            if (self.copy is not None or self.error is not None
                    or (self.pid_file.exists() and len(states) > 1
                        and all(s == "T" for s in states))):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.01)
        assert self.error is None, self.error
        assert self.copy is None, "the copy ran before the others were restored"

    def join(self, timeout_s: float = 30.0) -> RuncSandbox:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the copy is still held"
        assert self.error is None, self.error
        assert self.copy is not None
        return self.copy


@pytest.fixture
def copies() -> Iterator[list[RuncSandbox | CopyInThread]]:
    """What a test made; each destroyed after it, a copy still held let go first."""
    made: list[RuncSandbox | CopyInThread] = []
    yield made
    for item in made:
        if isinstance(item, CopyInThread):
            item.together.abort()
            item.thread.join(60)
            if item.copy is None:
                continue
            item = item.copy
        item.destroy()


def first_copy_held(
    sandbox: RuncSandbox, checkpoint: Path, copies: list[RuncSandbox | CopyInThread],
    count: int,
) -> tuple[StartTogether, CopyInThread]:
    """The first of ``count`` copies of a fork, restored and held stopped for the others."""
    together = StartTogether(count)
    first = CopyInThread(sandbox, checkpoint, f"a{os.getpid()}", together)
    copies.append(first)
    first.wait_all_stopped()
    return together, first


def running(copy: RuncSandbox) -> bool:
    states = [task_state(pid) for pid in cgroup_procs(copy.container_id)]
    return bool(states) and not any(s in ("T", "t") for s in states)


def test_a_copy_stays_stopped_until_the_last_is_restored(
    sandbox: RuncSandbox, checkpoint: Path, copies: list[RuncSandbox | CopyInThread]
) -> None:
    together, first = first_copy_held(sandbox, checkpoint, copies, 2)
    # Restored and sealed; without the others it does not run, however long they take.
    held_until = time.monotonic() + 1.0
    while time.monotonic() < held_until:
        states = first.states()
        assert states and all(s == "T" for s in states), states
        time.sleep(0.02)
    second = restore_copy(sandbox.options, f"b{os.getpid()}", checkpoint, Criu(),
                          together=together)
    copies.append(second)
    for copy in (first.join(), second):
        deadline = time.monotonic() + 5
        while not running(copy):
            assert time.monotonic() < deadline, copy.container_id
            time.sleep(0.01)


def test_a_copy_that_fails_lets_the_others_go(
    sandbox: RuncSandbox, checkpoint: Path, copies: list[RuncSandbox | CopyInThread]
) -> None:
    together, first = first_copy_held(sandbox, checkpoint, copies, 3)
    aborted = time.monotonic()
    together.abort()  # what the session layer does for a copy that failed
    copy = first.join(timeout_s=5)
    assert time.monotonic() - aborted < 2
    assert running(copy)
