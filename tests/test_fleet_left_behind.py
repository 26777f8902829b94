"""A server of a fleet killed while it started or stopped a session leaves its record
``starting`` or ``stopping``: no other server moves such a record on, so it stayed live for
ever, counted against its key's cap, its pod kept. Each reaper pass now ends the records
that stayed unchanged longer than any start or stop takes: a start cut short fails, a
delete cut short is done, and what is left of the sandbox goes. The fleet's records are
an in-memory table and the session table a stand-in (seams we own); a pod left half made
is removed against the cluster stand-in in tests/kubernetes/test_kubernetes_fleet.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from deskbox_server.schemas.sessions import SessionCreate
from deskbox_server.schemas.sessions import SessionState as S
from deskbox_server.sessions.fleet import Fleet
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.live import LiveSession
from deskbox_server.sessions.shared_registry import SharedRegistry

from .fleet_table import fleet_registry

PASS_S = 0.05
STUCK_S = 0.3  # how long a record may stay starting or stopping while a server lives


class SessionTable:
    """This server's sessions (none of the fleet's records is held here unless told)."""

    def __init__(self) -> None:
        self.held: dict[str, LiveSession] = {}
        self.removed: list[str] = []

    @property
    def holding(self) -> Mapping[str, LiveSession]:
        return self.held

    async def adopt_running(self, record: SessionRecord) -> LiveSession | str:
        raise NotImplementedError

    async def hand_over(self, live: LiveSession, ended: SessionRecord | None) -> None:
        raise NotImplementedError

    async def record_failure(self, record: SessionRecord, reason: str) -> None:
        raise NotImplementedError

    def stop_soon(self, live: LiveSession) -> None:
        raise NotImplementedError

    async def remove_left(self, record: SessionRecord) -> None:
        self.removed.append(record.id)


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SharedRegistry]:
    async with fleet_registry(tmp_path) as opened:
        yield opened


async def left(registry: SharedRegistry, session_id: str, state: S) -> SessionRecord:
    record = SessionRecord(id=session_id, owner="key_a", backend="kubernetes",
                           body=SessionCreate(), timeout_s=300)
    if state is not S.starting:
        record.transition(S.running)
        record.transition(state)
    await registry.save(record)
    return record


def fleet(registry: SharedRegistry, table: SessionTable) -> Fleet:
    return Fleet(registry, table, 10, 5, PASS_S, {S.starting: STUCK_S, S.stopping: STUCK_S})


async def passes(fleet: Fleet, seconds: float) -> None:
    until = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < until:
        await fleet.reconcile()
        await asyncio.sleep(PASS_S)


async def record_of(registry: SharedRegistry, session_id: str) -> SessionRecord:
    record = await registry.get(session_id)
    assert record is not None
    return record


async def test_a_start_and_a_delete_cut_short_are_ended(registry: SharedRegistry) -> None:
    await left(registry, "ses_starting", S.starting)
    await left(registry, "ses_stopping", S.stopping)
    table = SessionTable()
    reaper = fleet(registry, table)
    await passes(reaper, STUCK_S / 2)
    assert (await record_of(registry, "ses_starting")).state is S.starting
    assert table.removed == []
    await passes(reaper, STUCK_S)
    started = await record_of(registry, "ses_starting")
    assert started.state is S.failed and started.failure is not None
    assert started.failure.reason == "the server starting it stopped before it ran"
    assert (await record_of(registry, "ses_stopping")).state is S.stopped
    assert sorted(table.removed) == ["ses_starting", "ses_stopping"]
    assert await registry.live() == []  # no longer counted against the key's cap


async def test_a_record_a_server_moves_on_is_left_to_it(registry: SharedRegistry) -> None:
    """A long start whose server still writes its record (another version each time), and
    a session this server holds itself, are never taken for left behind."""
    moving = await left(registry, "ses_moving", S.starting)
    await left(registry, "ses_mine", S.stopping)
    table = SessionTable()
    table.held["ses_mine"] = LiveSession(await record_of(registry, "ses_mine"))
    reaper = fleet(registry, table)
    for _ in range(int(3 * STUCK_S / PASS_S)):
        await reaper.reconcile()
        await registry.save(moving)  # its server is alive: a new version
        await asyncio.sleep(PASS_S)
    assert (await record_of(registry, "ses_moving")).state is S.starting
    assert (await record_of(registry, "ses_mine")).state is S.stopping
    assert table.removed == []


async def test_a_record_changed_as_it_is_ended_keeps_the_change(
    registry: SharedRegistry,
) -> None:
    """The server was not dead after all: its write, between this server's read and its
    own, wins, and nothing of its sandbox is removed."""
    record = await left(registry, "ses_late", S.starting)
    table = SessionTable()
    reaper = fleet(registry, table)
    await reaper.reconcile()
    await asyncio.sleep(STUCK_S)
    read = registry.live_versions

    async def read_then_the_server_writes() -> list[tuple[SessionRecord, str]]:
        found = await read()
        record.transition(S.running)
        await registry.save(record)
        return found

    registry.live_versions = read_then_the_server_writes  # type: ignore[method-assign]
    await reaper.reconcile()
    assert (await record_of(registry, "ses_late")).state is S.running
    assert table.removed == []
