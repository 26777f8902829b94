"""The warm pool (sessions/pool.py) on runc sandboxes: a plain create takes a ready desktop
and the pool refills; pool desktops are nobody's until claimed and never shared; a create
that asks for more than the pool has starts cold. The order of the refills is looked at on
the local engine."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.api.auth import key_id
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.errors import DesktopFailed
from deskbox_server.sessions.pool import PoolKey
from deskbox_server.settings import Settings

from ..images import IMAGE_STATE_DIR
from .conftest import KEY_A, KEY_B, Server, running_server
from .helpers import assert_error, decode

pytestmark = pytest.mark.slow

KEY = PoolKey(1280, 800, 96)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("pool-state"), api_keys=[KEY_A, KEY_B],
        image_state_dir=IMAGE_STATE_DIR, reaper_interval_s=0.5, pool_size=1,
        pool_displays=["1280x800"],
    )
    with running_server(settings) as running:
        yield running


def wait_ready(server: Server, count: int = 1, timeout_s: float = 90.0) -> None:
    pool = server.services.manager.pool
    assert pool is not None
    deadline = time.monotonic() + timeout_s
    while pool.ready(KEY) < count:
        assert time.monotonic() < deadline, "the pool did not fill"
        time.sleep(0.1)


@contextmanager
def snapshot_of_a_plain_session(server: Server, a: httpx.Client) -> Iterator[dict[str, Any]]:
    """A plain session's snapshot (the session is deleted on exit), once the warm pool has
    refilled the desktop the session took: the pool starts one desktop at a time, so until
    then a snapshot pool's first restore would not begin (with a fast snapshot it had not,
    and a test's delete found nothing to drop)."""
    source = a.post("/v1/sessions", json={})
    assert source.status_code == 201, source.text
    sid = source.json()["id"]
    try:
        snapshot: dict[str, Any] = a.post(f"/v1/sessions/{sid}/snapshots").json()
        wait_ready(server, timeout_s=60)
        yield snapshot
    finally:
        a.delete(f"/v1/sessions/{sid}")


def test_a_plain_create_takes_a_ready_desktop_and_the_pool_refills(server: Server) -> None:
    pool = server.services.manager.pool
    assert pool is not None
    wait_ready(server)
    with server.client(KEY_A) as a, server.client(KEY_B) as b:
        # Ready desktops are nobody's: no listing shows them; /metrics counts them.
        assert a.get("/v1/sessions").json()["sessions"] == []
        assert 'deskbox_pool_ready{display="1280x800"} 1' in a.get("/metrics").text
        claimed_before = pool.claimed
        started = time.perf_counter()
        created = a.post("/v1/sessions", json={"labels": {"run": "1"}, "timeout_s": 60})
        elapsed = time.perf_counter() - started
        assert created.status_code == 201, created.text
        first = created.json()
        print(f"create from the pool: {elapsed * 1000:.0f} ms")
        try:
            assert first["state"] == "running" and first["labels"] == {"run": "1"}
            assert pool.claimed == claimed_before + 1
            shot = a.get(f"/v1/sessions/{first['id']}/screenshot", params={"format": "png"})
            assert shot.status_code == 200
            image = decode(shot.content)
            assert image.size == (1280, 800)
            assert len(image.crop((0, 0, 1280, 90)).getcolors(1 << 20) or []) >= 16  # toolbar
            # What one user leaves in their desktop ...
            wrote = a.post(f"/v1/sessions/{first['id']}/exec",
                           json={"cmd": ["sh", "-c", "echo secret > /tmp/mine"]})
            assert wrote.status_code == 200 and wrote.json()["exit_code"] == 0

            wait_ready(server)  # refilled in the background
            second = b.post("/v1/sessions", json={})
            assert second.status_code == 201, second.text
            other = second.json()
            try:
                assert other["id"] != first["id"]
                assert pool.claimed == claimed_before + 2
                # ... never reaches another's: each pool desktop is used once.
                looked = b.post(f"/v1/sessions/{other['id']}/exec",
                                json={"cmd": ["cat", "/tmp/mine"]})
                assert looked.status_code == 200 and looked.json()["exit_code"] != 0
                assert a.get(f"/v1/sessions/{other['id']}").status_code == 404
                assert [s["id"] for s in b.get("/v1/sessions").json()["sessions"]] == [
                    other["id"]]
            finally:
                b.delete(f"/v1/sessions/{other['id']}")
        finally:
            a.delete(f"/v1/sessions/{first['id']}")


def test_a_create_asking_for_more_starts_cold(server: Server) -> None:
    pool = server.services.manager.pool
    assert pool is not None
    wait_ready(server)
    claimed = pool.claimed
    with server.client(KEY_A) as a:
        for body in ({"browser": {"start_url": "data:text/html,<h1>cold</h1>"}},
                     {"display": {"width": 1024, "height": 768}},
                     {"resources": {"cpus": 0.5}}):
            created = a.post("/v1/sessions", json=body)
            assert created.status_code == 201, created.text
            a.delete(f"/v1/sessions/{created.json()['id']}")
        assert pool.claimed == claimed
        assert pool.ready(KEY) == 1


def test_the_pool_respects_the_caps(server: Server) -> None:
    """A full key gets 429 and the ready desktop stays in the pool."""
    wait_ready(server)
    settings = server.services.settings
    pool = server.services.manager.pool
    assert pool is not None
    claimed = pool.claimed
    original = settings.max_sessions_per_key
    settings.max_sessions_per_key = 0
    try:
        with server.client(KEY_A) as a:
            response = a.post("/v1/sessions", json={})
            assert response.status_code == 429, response.text
    finally:
        settings.max_sessions_per_key = original
    assert pool.claimed == claimed and pool.ready(KEY) == 1


def test_pool_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        Settings(pool_displays=["big"])
    assert Settings(pool_displays="1280x800, 1024x768").pool_displays == [
        "1280x800", "1024x768"]



def test_a_snapshot_that_never_restores_does_not_starve_the_other_pools(
    server: Server, caplog: pytest.LogCaptureFixture,
) -> None:
    """Its pool's restores fail (the snapshot's files damaged on disk); the display pool
    still refills. Before, the refills retried that snapshot every 5 s and never reached
    another pool again."""
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        sid = snapshot["id"]
        (server.services.manager.snapshots.directory(sid) / "sandbox.json").unlink()
        with caplog.at_level("WARNING", logger="deskbox.pool"):
            assert a.put(f"/v1/snapshots/{sid}/pool", json={"size": 1}).status_code == 200
            deadline = time.monotonic() + 60
            while not any(sid in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the damaged snapshot was never restored"
                time.sleep(0.1)
        pool = server.services.manager.pool
        assert pool is not None
        claimed = pool.claimed
        plain = a.post("/v1/sessions", json={})
        assert plain.status_code == 201, plain.text
        assert pool.claimed == claimed + 1  # the display pool's desktop taken
        try:
            wait_ready(server, timeout_s=60)
        finally:
            a.delete(f"/v1/sessions/{plain.json()['id']}")
            a.put(f"/v1/snapshots/{sid}/pool", json={"size": 0})


def test_pools_set_at_once_keep_to_the_keys_cap(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each change checked the cap, then waited (the snapshot unpacked for fast restores)
    before it set its pool: two at once both passed, and the key kept twice its cap."""
    monkeypatch.setattr(server.services.manager.catalog, "_cap_per_key", 1)
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as first:
        second = a.post(f"/v1/sessions/{first['session_id']}/snapshots")
        assert second.status_code == 201, second.text
        answers: dict[str, int] = {}
        together = threading.Barrier(2)

        def pool(snapshot_id: str) -> None:
            with server.client(KEY_A) as own:
                together.wait()
                answers[snapshot_id] = own.put(f"/v1/snapshots/{snapshot_id}/pool",
                                               json={"size": 1}).status_code

        threads = [threading.Thread(target=pool, args=(s,))
                   for s in (first["id"], second.json()["id"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        try:
            assert sorted(answers.values()) == [200, 422], answers
        finally:
            for snapshot_id in answers:
                a.delete(f"/v1/snapshots/{snapshot_id}")


def test_a_snapshot_of_another_engine_is_not_pooled(server: Server) -> None:
    """This server's pool makes runc sandboxes: a snapshot of a VM (here its record says so)
    gets a 422 naming its backend, not a pool whose every restore fails."""
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        store = server.services.manager.snapshots
        record = store.get(key_id(KEY_A), snapshot["id"])
        store.save(record.model_copy(update={"backend": "vm"}))
        refused = a.put(f"/v1/snapshots/{snapshot['id']}/pool", json={"size": 1})
        assert refused.status_code == 422, refused.text
        assert "'vm'" in refused.json()["error"]["message"]
        assert a.get(f"/v1/snapshots/{snapshot['id']}").json()["pool"] == {
            "size": 0, "ready": 0}


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_a_snapshot_pool_serves_creates_from_the_snapshot(server: Server) -> None:
    pool = server.services.manager.pool
    assert pool is not None
    with server.client(KEY_A) as a, server.client(KEY_B) as b:
        source = a.post("/v1/sessions", json={"browser": {
            "start_url": "data:text/html,<body style='background:%2300f'>snap</body>"}})
        assert source.status_code == 201, source.text
        sid = source.json()["id"]
        try:
            snapshot = a.post(f"/v1/sessions/{sid}/snapshots").json()
            assert snapshot["pool"] == {"size": 0, "ready": 0}
            # Only the owner can pool it; sizes are bounded; the key's cap holds.
            assert b.put(f"/v1/snapshots/{snapshot['id']}/pool",
                         json={"size": 1}).status_code == 404
            assert a.put(f"/v1/snapshots/{snapshot['id']}/pool",
                         json={"size": 9}).status_code == 422
            pooled = a.put(f"/v1/snapshots/{snapshot['id']}/pool", json={"size": 1})
            assert pooled.status_code == 200, pooled.text
            assert pooled.json()["pool"]["size"] == 1

            def ready() -> bool:
                body = a.get(f"/v1/snapshots/{snapshot['id']}").json()
                return bool(body["pool"]["ready"] == 1)

            deadline = time.monotonic() + 60
            while not ready():
                assert time.monotonic() < deadline, "the snapshot's pool did not fill"
                time.sleep(0.1)
            claimed = pool.claimed
            copy = a.post("/v1/sessions", json={"from_snapshot": snapshot["id"]})
            assert copy.status_code == 201, copy.text
            assert pool.claimed == claimed + 1  # taken from the pool, not restored now
            shot = a.get(f"/v1/sessions/{copy.json()['id']}/screenshot",
                         params={"format": "png"})
            assert decode(shot.content).getpixel((640, 500))[:3] == (0, 0, 255)
            assert a.delete(f"/v1/sessions/{copy.json()['id']}").status_code == 204
            # Deleting the snapshot empties its pool.
            assert a.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
            assert not pool.snapshot_keys(key_id(KEY_A))
        finally:
            a.delete(f"/v1/sessions/{sid}")


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_a_pool_set_to_0_removes_the_images_unpacked_for_it(
    server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool unpacks its snapshot's images beside the archive (several times its size) for
    fast restores: they count in the key's snapshot quota while kept, and pool 0 removes
    them; the snapshot still restores, from its archive. They stayed for good, counted
    nowhere."""
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        sid = snapshot["id"]
        images = server.settings.state_dir / "snapshots" / sid / "images"
        try:
            assert a.put(f"/v1/snapshots/{sid}/pool", json={"size": 1}).status_code == 200
            assert images.is_dir()
            # A quota just above what the key's snapshots take packed: the unpacked
            # images take it over.
            packed = sum(s["size_bytes"] for s in a.get("/v1/snapshots").json()["snapshots"])
            monkeypatch.setattr(server.services.manager.copies, "_snapshot_quota_mb",
                                (packed >> 20) + 1)
            source = snapshot["session_id"]
            assert_error(a.post(f"/v1/sessions/{source}/snapshots"), 429, "quota_exceeded")

            assert a.put(f"/v1/snapshots/{sid}/pool", json={"size": 0}).status_code == 200
            assert not images.exists()
            assert (images.parent / "images.tar.zst").is_file()
            second = a.post(f"/v1/sessions/{source}/snapshots")
            assert second.status_code == 201, second.text
            assert a.delete(f"/v1/snapshots/{second.json()['id']}").status_code == 204
            copy = a.post("/v1/sessions", json={"from_snapshot": sid})
            assert copy.status_code == 201, copy.text
            assert a.delete(f"/v1/sessions/{copy.json()['id']}").status_code == 204
        finally:
            a.delete(f"/v1/snapshots/{sid}")


def test_deleting_a_snapshot_while_its_pool_restores_is_no_failure(
    server: Server, caplog: pytest.LogCaptureFixture,
) -> None:
    """The deleted snapshot's images vanish under the copy being restored, whose restore
    then fails: that is the delete working, not the pool failing (it once logged a warning
    "starting a desktop ... failed" for it, and waited 2 s before going on)."""
    pool = server.services.manager.pool
    assert pool is not None
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        with caplog.at_level("INFO", logger="deskbox.pool"):
            pooled = a.put(f"/v1/snapshots/{snapshot['id']}/pool", json={"size": 1})
            assert pooled.status_code == 200, pooled.text
            # At once: the pool's first restore has begun and not ended.
            assert a.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
            deadline = time.monotonic() + 30
            while not any("dropped" in r.getMessage() or r.levelname == "WARNING"
                          for r in caplog.records):
                assert time.monotonic() < deadline, "the pool's copy was never dropped"
                time.sleep(0.1)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert not warnings
        assert not pool.snapshot_keys(key_id(KEY_A))


def test_a_refused_snapshot_delete_keeps_its_pool(server: Server) -> None:
    """A snapshot a create is restoring from cannot be deleted (409): its pool keeps its
    ready copies. Before, the delete destroyed them first and was refused after (and once,
    the snapshot kept its pool's size with no ready copy until the server restarted)."""
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        sid = snapshot["id"]
        assert a.put(f"/v1/snapshots/{sid}/pool", json={"size": 2}).status_code == 200
        deadline = time.monotonic() + 90
        while a.get(f"/v1/snapshots/{sid}").json()["pool"]["ready"] != 2:
            assert time.monotonic() < deadline, a.get(f"/v1/snapshots/{sid}").text
            time.sleep(0.1)
        made: list[httpx.Response] = []

        def cold_copy() -> None:
            with server.client(KEY_A) as own:  # resources of its own: restored now
                own.timeout = httpx.Timeout(120)
                made.append(own.post("/v1/sessions", json={
                    "from_snapshot": sid, "resources": {"cpus": 1}}))

        copying = threading.Thread(target=cold_copy)
        copying.start()
        # Into the restore: a fixed 0.25 s was not always enough on a busy host (the delete
        # came first, and went through).
        store, deadline = server.services.manager.snapshots, time.monotonic() + 60
        while not store.restoring(sid):
            assert time.monotonic() < deadline and copying.is_alive(), made
            time.sleep(0.01)
        deleted = a.delete(f"/v1/snapshots/{sid}")
        pool_then = a.get(f"/v1/snapshots/{sid}").json()["pool"]
        copying.join(120)
        [copy] = made
        assert copy.status_code == 201, copy.text
        assert a.delete(f"/v1/sessions/{copy.json()['id']}").status_code == 204
        assert deleted.status_code == 409, deleted.text
        assert pool_then == {"size": 2, "ready": 2}
        assert a.delete(f"/v1/snapshots/{sid}").status_code == 204


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_a_snapshot_pool_dropped_while_its_copy_settles_leaves_the_refills_running(
    server: Server, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pool desktop, once started, gets an empty batch before it counts as ready. The
    snapshot deleted during that batch: the copy is dropped and the pool goes on refilling
    (the missing queue once raised, which ended the refills and failed the shutdown)."""
    pool = server.services.manager.pool
    assert pool is not None
    settling, release = threading.Event(), threading.Event()
    hold = [False]
    run = AgentDesktop.run

    async def held(self: AgentDesktop, actions: Sequence[Any], *args: Any) -> Any:
        if hold[0] and not actions:  # the pool's empty batch (our seam, the real call after)
            hold[0] = False
            settling.set()
            await asyncio.to_thread(release.wait, 30)
        return await run(self, actions, *args)

    monkeypatch.setattr(AgentDesktop, "run", held)
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        hold[0] = True  # the warm pool's refill, done above, is not the one held
        try:
            with caplog.at_level("INFO", logger="deskbox.pool"):
                pooled = a.put(f"/v1/snapshots/{snapshot['id']}/pool", json={"size": 1})
                assert pooled.status_code == 200, pooled.text
                assert settling.wait(60), "the snapshot's copy never got its empty batch"
                assert a.delete(f"/v1/snapshots/{snapshot['id']}").status_code == 204
                release.set()
                deadline = time.monotonic() + 30
                while not any("pool dropped" in r.getMessage() for r in caplog.records):
                    assert time.monotonic() < deadline, "the settled copy was never dropped"
                    time.sleep(0.05)
        finally:
            release.set()
        assert not pool.snapshot_keys(key_id(KEY_A))
        # The refills go on: a create takes the warm desktop and the pool makes another.
        claimed = pool.claimed
        copy = a.post("/v1/sessions", json={})
        assert copy.status_code == 201, copy.text
        assert pool.claimed == claimed + 1
        a.delete(f"/v1/sessions/{copy.json()['id']}")
        wait_ready(server, timeout_s=60)


def test_a_shutdown_during_a_refill_ends_once_that_desktop_has_started(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The refill's start cannot be cancelled; the close must not wait past it (it once
    missed its wake-up and waited out its whole timeout, 40 s)."""
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("pool-close"), api_keys=[KEY_A],
        image_state_dir=IMAGE_STATE_DIR, pool_size=1, pool_displays=["1280x800"],
    )
    with running_server(settings) as running:
        pool = running.services.manager.pool
        assert pool is not None and pool.ready(KEY) == 0  # its first desktop is starting
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    assert took < 15, f"the shutdown took {took:.1f} s"
    assert pool.ready(KEY) == 0


def test_a_pool_whose_first_batches_fail_does_not_starve_the_other_pools(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every 640x400 desktop starts, then fails its empty batch; the 800x600 pool still
    fills, and the failing one is tried again after a pause. Before, the refill started
    640x400 desktops one after another for ever and never reached the other pool."""
    failed = [0]
    run = AgentDesktop.run

    async def failing(self: AgentDesktop, actions: Sequence[Any], *args: Any) -> Any:
        # The pool's empty batch on the small screen (our seam; the real call otherwise).
        if not actions and (await self.info()).width == 640:
            failed[0] += 1
            raise DesktopFailed("the first batch failed")
        return await run(self, actions, *args)

    monkeypatch.setattr(AgentDesktop, "run", failing)
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("pool-batch"), api_keys=[KEY_A],
        backends=["local"], default_backend="local", pool_size=1,
        pool_displays=["640x400", "800x600"],
    )
    with running_server(settings) as running:
        pool = running.services.manager.pool
        assert pool is not None
        deadline = time.monotonic() + 60
        while pool.ready(PoolKey(800, 600, 96)) < 1:
            assert time.monotonic() < deadline, (
                f"the 800x600 pool never filled ({failed[0]} failed first batches)")
            time.sleep(0.1)
        assert failed[0] >= 1 and pool.ready(PoolKey(640, 400, 96)) == 0
        with running.client() as client:  # the full pool serves its display
            created = client.post("/v1/sessions", json={
                "display": {"width": 800, "height": 600}})
            assert created.status_code == 201, created.text
            assert created.json()["state"] == "running" and pool.claimed == 1
            client.delete(f"/v1/sessions/{created.json()['id']}")


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_a_snapshot_pool_refuses_what_its_engine_cannot_honour(server: Server) -> None:
    """A create ``from_snapshot`` with a ``runtime_class`` (which the container engine
    lacks) is the 422 a cold create gets, and the ready copy stays in the pool. Before,
    the pool's copy was handed out, running, before the engine's check."""
    pool = server.services.manager.pool
    assert pool is not None
    with server.client(KEY_A) as a, snapshot_of_a_plain_session(server, a) as snapshot:
        sid = snapshot["id"]
        try:
            assert a.put(f"/v1/snapshots/{sid}/pool", json={"size": 1}).status_code == 200
            deadline = time.monotonic() + 60
            while a.get(f"/v1/snapshots/{sid}").json()["pool"]["ready"] != 1:
                assert time.monotonic() < deadline, "the snapshot's pool did not fill"
                time.sleep(0.1)
            claimed = pool.claimed
            cold = a.post("/v1/sessions", json={
                "from_snapshot": sid, "runtime_class": "gvisor", "resources": {"cpus": 1}})
            assert_error(cold, 422, "invalid_request")
            pooled = a.post("/v1/sessions", json={"from_snapshot": sid,
                                                  "runtime_class": "gvisor"})
            if pooled.status_code == 201:
                a.delete(f"/v1/sessions/{pooled.json()['id']}")
            assert_error(pooled, 422, "invalid_request")
            assert pooled.json()["error"]["message"] == cold.json()["error"]["message"]
            assert "runtime_class" in pooled.json()["error"]["message"]
            assert pool.claimed == claimed
            assert a.get(f"/v1/snapshots/{sid}").json()["pool"] == {"size": 1, "ready": 1}
            running = a.get("/v1/sessions", params={"state": "running"}).json()["sessions"]
            assert [s["id"] for s in running] == [snapshot["session_id"]]
        finally:
            a.delete(f"/v1/snapshots/{sid}")


def test_a_pool_of_an_engine_without_egress_none_refuses_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The local engine offers egress "all" only: a create asking for egress "none" is a
    422 naming it, pool or not. Before, the warm pool handed out one of its desktops, on
    the host's network, to the create that asked for none."""
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("pool-local"), api_keys=[KEY_A],
        backends=["local"], default_backend="local", pool_size=1,
        pool_displays=["1280x800"],
    )
    with running_server(settings) as running, running.client() as client:
        pool = running.services.manager.pool
        assert pool is not None
        deadline = time.monotonic() + 60
        while pool.ready(KEY) < 1:
            assert time.monotonic() < deadline, "the pool did not fill"
            time.sleep(0.1)
        created = client.post("/v1/sessions", json={"network": {"egress": "none"}})
        if created.status_code == 201:
            client.delete(f"/v1/sessions/{created.json()['id']}")
        assert_error(created, 422, "invalid_request")
        assert "network egress 'none' needs" in created.json()["error"]["message"]
        assert pool.claimed == 0 and pool.ready(KEY) == 1
        plain = client.post("/v1/sessions", json={})  # the pool still serves what it can
        assert plain.status_code == 201, plain.text
        assert pool.claimed == 1
        client.delete(f"/v1/sessions/{plain.json()['id']}")
