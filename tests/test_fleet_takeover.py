"""A server of a fleet that cannot reach a session another server runs: one failed
takeover may be a passing network fault, so the session fails for the whole fleet only
once takeovers have failed for two reaper passes; a delete fails it at once. The fleet's
records are an in-memory table and the session table a stand-in (seams we own); the
takeover itself against the cluster stand-in is tests/kubernetes/test_kubernetes_fleet.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from deskbox_server.errors import SessionFailed
from deskbox_server.schemas.sessions import SessionCreate
from deskbox_server.schemas.sessions import SessionState as S
from deskbox_server.sessions.fleet import Fleet
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.live import LiveSession
from deskbox_server.sessions.recovery import failed
from deskbox_server.sessions.shared_registry import SharedRegistry

from .fleet_table import fleet_registry

PASS_S = 0.2  # the reaper's interval: a session is given up after two passes


class SessionTable:
    """The other server's session, which this one reaches only after ``unreachable``
    failed attempts."""

    def __init__(self, registry: SharedRegistry, unreachable: int) -> None:
        self.registry = registry
        self.unreachable = unreachable
        self.attempts = 0
        self.attempt_s = 0.0  # how long an attempt takes
        self.held: dict[str, LiveSession] = {}

    @property
    def holding(self) -> Mapping[str, LiveSession]:
        return self.held

    async def adopt_running(self, record: SessionRecord) -> LiveSession | str:
        self.attempts += 1
        await asyncio.sleep(self.attempt_s)
        if self.attempts <= self.unreachable:
            return "the server restarted and could not re-adopt it: connection refused"
        self.held[record.id] = LiveSession(record)
        return self.held[record.id]

    async def hand_over(self, live: LiveSession, ended: SessionRecord | None) -> None:
        raise NotImplementedError

    async def record_failure(self, record: SessionRecord, reason: str) -> None:
        await self.registry.save(failed(record, reason))

    def stop_soon(self, live: LiveSession) -> None:
        raise NotImplementedError


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SharedRegistry]:
    async with fleet_registry(tmp_path) as opened:
        yield opened


async def fleet_with_session(registry: SharedRegistry, unreachable: int
                             ) -> tuple[Fleet, SessionTable]:
    record = SessionRecord(id="ses_elsewhere", owner="key_a", backend="kubernetes",
                           body=SessionCreate(), timeout_s=300, state=S.running)
    record.touch()
    await registry.save(record)
    table = SessionTable(registry, unreachable)
    return Fleet(registry, table, 10, 5, PASS_S, {}), table


async def state(registry: SharedRegistry) -> S:
    record = await registry.get("ses_elsewhere")
    assert record is not None
    return record.state


async def test_a_passing_fault_answers_502_and_leaves_the_session_running(
    registry: SharedRegistry,
) -> None:
    fleet, _ = await fleet_with_session(registry, unreachable=2)
    for _ in range(2):
        with pytest.raises(SessionFailed, match="runs, but this server could not reach"
                           ".*connection refused.*try again"):
            await fleet.reach("key_a", "ses_elsewhere")
        assert await state(registry) is S.running
    live = await fleet.reach("key_a", "ses_elsewhere")
    assert live is not None and live.record.id == "ses_elsewhere"
    assert await state(registry) is S.running


async def test_a_session_unreachable_for_two_passes_fails_for_the_fleet(
    registry: SharedRegistry,
) -> None:
    fleet, _ = await fleet_with_session(registry, unreachable=100)
    with pytest.raises(SessionFailed, match="try again"):
        await fleet.reach("key_a", "ses_elsewhere")
    await asyncio.sleep(2 * PASS_S)
    with pytest.raises(SessionFailed, match="has failed: no server of the fleet could "
                       "reach it: connection refused"):
        await fleet.reach("key_a", "ses_elsewhere")
    assert await state(registry) is S.failed


async def test_a_delete_of_an_unreachable_session_fails_it_at_once(
    registry: SharedRegistry,
) -> None:
    fleet, table = await fleet_with_session(registry, unreachable=100)
    record = await registry.get("ses_elsewhere")
    assert record is not None
    assert await fleet.reach_to_delete(record) is None
    assert await state(registry) is S.failed
    assert table.attempts == 1


async def test_a_delete_joining_a_patient_takeover_still_fails_it_at_once(
    registry: SharedRegistry,
) -> None:
    """A request's takeover that fails answers it "try again"; a delete that arrived
    meanwhile and shared that attempt must not get the same answer: it ends the session."""
    fleet, table = await fleet_with_session(registry, unreachable=100)
    table.attempt_s = 0.1
    record = await registry.get("ses_elsewhere")
    assert record is not None
    patient = asyncio.create_task(fleet.reach("key_a", "ses_elsewhere"))
    await asyncio.sleep(0.02)  # its takeover is under way
    assert await fleet.reach_to_delete(record) is None
    assert await state(registry) is S.failed
    with pytest.raises(SessionFailed, match="try again"):
        await patient
    assert table.attempts == 2
