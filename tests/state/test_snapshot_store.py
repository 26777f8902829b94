"""The snapshot store keeps a snapshot that a create restores from its delete, and a
deleted one from a create that read its record just before (sessions/snapshots.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from deskbox_server.errors import Conflict, NotFound
from deskbox_server.schemas.sessions import SessionCreate
from deskbox_server.sessions.snapshots import SnapshotRecord, SnapshotStore

OWNER = "key_a"


def saved(store: SnapshotStore) -> SnapshotRecord:
    snapshot_id, directory = store.new_id()
    directory.mkdir(mode=0o700)
    (directory / "images.tar.zst").write_bytes(b"checkpoint")
    record = SnapshotRecord(
        id=snapshot_id, owner=OWNER, session_id="ses_0123456789abcdef0123",
        backend="container", body=SessionCreate(), created_at=datetime.now(UTC),
        size_bytes=10, raw_bytes=10,
    )
    store.save(record)
    return record


def delete(store: SnapshotStore, snapshot_id: str) -> None:
    """A delete as the API makes it, with nothing to do between its two halves."""
    store.begin_delete(OWNER, snapshot_id)
    store.finish_delete(snapshot_id)


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    opened = SnapshotStore(tmp_path / "snapshots")
    opened.open()
    return opened


def test_a_delete_between_reading_a_snapshot_and_holding_it_is_a_404(
    store: SnapshotStore,
) -> None:
    record = saved(store)
    read = store.get(OWNER, record.id)  # a create from the snapshot read its record
    delete(store, record.id)  # then a delete came
    with pytest.raises(NotFound):
        store.hold(read)
    assert not store.directory(record.id).exists()
    with pytest.raises(NotFound):
        delete(store, record.id)


def test_a_held_snapshot_is_kept_until_released(store: SnapshotStore) -> None:
    record = saved(store)
    directory = store.hold(record)
    with pytest.raises(Conflict) as refused:
        delete(store, record.id)
    assert "is being restored" in refused.value.message
    assert (directory / "images.tar.zst").read_bytes() == b"checkpoint"
    store.release(record.id)
    delete(store, record.id)
    assert not directory.exists()


def test_a_delete_that_fails_leaves_the_snapshot_usable(store: SnapshotStore) -> None:
    record = saved(store)
    (store.root / ".forks").write_text("not a directory")  # where deletes move snapshots
    with pytest.raises(OSError):
        delete(store, record.id)
    assert store.hold(record) == store.directory(record.id)
    assert [r.id for r in store.list(OWNER)] == [record.id]


def test_a_delete_called_off_leaves_the_snapshot_usable(store: SnapshotStore) -> None:
    record = saved(store)
    store.begin_delete(OWNER, record.id)
    with pytest.raises(NotFound):  # no restore begins while the delete may go on
        store.hold(record)
    store.cancel_delete(record.id)
    assert store.hold(record) == store.directory(record.id)
