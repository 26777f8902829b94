"""A live view or DevTools client opened with a session token, in a fleet: the token is
looked up again every few seconds in the fleet's records (the cluster's API). A lookup
that fails (the API timed out or throttled) closed every such connection as "revoked or
expired" though the token held; now it is tried again, and the connection ends only when
the token is revoked or its expiry passes. The fleet's records are an in-memory table (a
seam we own, tests/fleet_table.py); the cluster's own records are tested in
tests/kubernetes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import HTTPConnection

from deskbox_server.api import tokens as tokens_api
from deskbox_server.api.tokens import TOKEN_ENDED, until_token_ends
from deskbox_server.engines.base import SharedEntry
from deskbox_server.errors import Capacity, SessionFailed
from deskbox_server.sessions import tokens as tokens_store
from deskbox_server.sessions.tokens import TokenStore

from .fleet_table import FleetTable

SESSION = "ses_0123456789abcdef0123"
RECHECK_S = 0.02


class OutageTable(FleetTable):
    """The fleet's records, out of reach while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.failed_reads = 0

    async def read(self, session_id: str) -> SharedEntry | None:
        if self.down:
            self.failed_reads += 1
            raise SessionFailed("the Kubernetes API did not answer within 10 s")
        return await super().read(session_id)


def opened_with(token: str) -> HTTPConnection:
    return HTTPConnection({"type": "websocket", "path": f"/v1/sessions/{SESSION}/vnc",
                           "query_string": f"token={token}".encode(), "headers": []})


async def watch(ttl_s: float, outage: bool, revoke: bool) -> tuple[str | None, int]:
    """What ``until_token_ends`` answered within 1 s (None: nothing, the connection
    stays), and how many lookups failed."""
    table = OutageTable()
    await table.put(SESSION, "key_a", True, "{}")
    store = TokenStore(shared=table)
    token, record = await store.issue("key_a", SESSION, "view", ttl_s)
    services: Any = SimpleNamespace(tokens=store)
    ends = asyncio.create_task(until_token_ends(services, opened_with(token), SESSION, "view"))
    await asyncio.sleep(5 * RECHECK_S)  # looked up once at least, while the table answers
    table.down = outage
    if revoke:
        table.down = False
        await store.revoke("key_a", SESSION, record.id)
    try:
        return await asyncio.wait_for(asyncio.shield(ends), 1.0), table.failed_reads
    except TimeoutError:
        ends.cancel()
        return None, table.failed_reads


@pytest.fixture(autouse=True)
def quick_rechecks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens_api, "_RECHECK_SHARED_S", RECHECK_S)


def test_a_lookup_that_fails_does_not_close_the_connection() -> None:
    ended, failed_reads = asyncio.run(watch(ttl_s=600, outage=True, revoke=False))
    assert ended is None, "a connection closed because the fleet's records were out of reach"
    assert failed_reads > 3, "the lookups did not fail: no outage was tested"


def test_a_revoked_token_still_ends_it() -> None:
    ended, _ = asyncio.run(watch(ttl_s=600, outage=False, revoke=True))
    assert ended == TOKEN_ENDED


def test_an_outage_past_the_tokens_expiry_ends_it() -> None:
    ended, failed_reads = asyncio.run(watch(ttl_s=0.5, outage=True, revoke=False))
    assert failed_reads > 3
    assert ended == TOKEN_ENDED


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def replicas(clock: Clock) -> tuple[FleetTable, TokenStore, TokenStore]:
    """The fleet's records, and two replicas' token stores over them."""
    table = FleetTable()
    await table.put(SESSION, "key_a", True, "{}")
    return (table, TokenStore(clock, shared=table), TokenStore(clock, shared=table))


def test_a_sessions_token_cap_counts_the_tokens_of_every_replica() -> None:
    """A session's 256 live tokens, issued through one replica: the other issued 256 more
    (each counted only its own), all kept in the session's one record."""

    async def scenario() -> None:
        _, one, two = await replicas(Clock())
        for _ in range(tokens_store._MAX_PER_SESSION):
            await one.issue("key_a", SESSION, "view", 600)
        with pytest.raises(Capacity, match="256 live tokens"):
            await two.issue("key_a", SESSION, "view", 600)

    asyncio.run(scenario())


def test_a_token_revoked_through_another_replica_frees_its_place() -> None:
    """At the cap, a token revoked through the other replica: the one that issued them
    still counted it, and refused every new token (429 "revoke some first") until they
    expired, up to 7 days later."""

    async def scenario() -> None:
        _, one, two = await replicas(Clock())
        issued = [await one.issue("key_a", SESSION, "view", 600)
                  for _ in range(tokens_store._MAX_PER_SESSION)]
        await two.revoke("key_a", SESSION, issued[0][1].id)
        token, _ = await one.issue("key_a", SESSION, "view", 600)
        assert await two.verify(token, SESSION, "view")

    asyncio.run(scenario())


def test_expired_tokens_leave_the_sessions_record() -> None:
    """Each token a key of the session's record (a Secret, at most 1 MiB), never removed
    when it expired: a session given a short token per connection filled it within days,
    and then its record could not be written."""

    async def scenario() -> None:
        clock = Clock()
        table, one, two = await replicas(clock)
        for store in (one, two, one):
            await store.issue("key_a", SESSION, "cdp", 60)
            clock.now += 61
        await two.issue("key_a", SESSION, "cdp", 60)
        assert len(table.entries[SESSION].tokens) == 1

    asyncio.run(scenario())
