"""A fleet's records are decoded off the event loop once there are many of them: a key's
day of sessions (thousands) or the fleet's live ones must not stall every other request
while they parse. The fleet's records are the in-memory table (a seam we own)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from deskbox_server.schemas.sessions import SessionCreate
from deskbox_server.schemas.sessions import SessionState as S
from deskbox_server.sessions import shared_registry
from deskbox_server.sessions.lifecycle import SessionRecord
from deskbox_server.sessions.listing import SessionQuery
from deskbox_server.sessions.shared_registry import SharedRegistry

from .fleet_table import fleet_registry


@pytest.fixture
async def registry(tmp_path: Path) -> AsyncIterator[SharedRegistry]:
    async with fleet_registry(tmp_path) as opened:
        yield opened


async def test_many_records_list_whole_and_decode_on_a_thread(
    registry: SharedRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(200):
        await registry.save(SessionRecord(id=f"ses_{n:03}", owner="key_a", backend="local",
                                          body=SessionCreate(), timeout_s=300,
                                          state=S.running if n % 2 else S.stopped))
    decoded_on: set[str] = set()
    decode = shared_registry.record_from_json

    def watched(text: str) -> SessionRecord:
        decoded_on.add(threading.current_thread().name)
        return decode(text)

    monkeypatch.setattr(shared_registry, "record_from_json", watched)
    loop_thread = threading.current_thread().name

    assert len(await registry.owned("key_a")) == 200
    page, more = await registry.page(SessionQuery(owner="key_a", limit=50))
    assert len(page) == 50 and more
    assert decoded_on and loop_thread not in decoded_on

    decoded_on.clear()
    found = await registry.get("ses_007")  # one record: not worth a thread's hop
    assert found is not None and found.state == S.running
    assert decoded_on == {loop_thread}
