"""Suite-wide checks: nothing a test started may outlive the suite."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.driver.processes import become_subreaper


def _live_descendants(root: int) -> list[str]:
    """Processes below ``root`` that still run (zombies excluded), as "pid name"."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        name = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
        fields = raw[raw.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        info[int(entry.name)] = (name, fields[0])
    found: list[str] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        name, state = info[pid]
        if state != b"Z":
            found.append(f"{pid} {name}")
        stack.extend(children.get(pid, []))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_survives_the_suite() -> Iterator[None]:
    """Everything a test starts must be gone at the end.

    As a subreaper, this process inherits whatever a desktop leaves orphaned, so a leak
    shows up below us rather than vanishing under PID 1.
    """
    become_subreaper()
    yield
    deadline = time.monotonic() + 5
    while (left := _live_descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the suite: {left}"
