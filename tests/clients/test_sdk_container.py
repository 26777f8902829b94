"""The SDK on the container backend (the default): exec and files, sync and async."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from deskbox import AsyncDeskbox, Conflict, Deskbox, NotFound, Session, UnprocessableEntity
from deskbox_server.engines.runc.criu import Criu

from ..api.conftest import KEY_A, Server
from ..api.containers import container_server as served_container
from ..images import session_image

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def container_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()
    with served_container(tmp_path_factory, "client-container") as running:
        yield running


@pytest.fixture(scope="module")
def session(container_server: Server) -> Iterator[Session]:
    with Deskbox(container_server.url, KEY_A) as box:
        with box.sessions.create(display={"width": 800, "height": 600}) as created:
            yield created


def test_exec_and_files(session: Session, tmp_path_factory: pytest.TempPathFactory) -> None:
    assert session.data.backend == "container"
    done = session.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (done.exit_code, done.stdout, done.stderr, done.ok) == (3, "out\n", "err\n", False)
    assert session.exec("echo $DISPLAY").stdout.strip().startswith(":")
    slow = session.exec(["sleep", "5"], timeout_s=1)
    assert slow.timed_out and slow.exit_code is None

    uploaded = session.upload("/tmp/hello.txt", b"hello\n")
    assert (uploaded.path, uploaded.size) == ("/tmp/hello.txt", 6)
    assert session.exec(["cat", "/tmp/hello.txt"]).stdout == "hello\n"
    assert session.download("/tmp/hello.txt") == b"hello\n"
    local = tmp_path_factory.mktemp("upload") / "local.bin"
    local.write_bytes(bytes(range(256)))
    session.upload("/tmp/local.bin", local)
    assert session.download("/tmp/local.bin") == bytes(range(256))
    with pytest.raises(NotFound):
        session.download("/tmp/missing")
    with pytest.raises(UnprocessableEntity):
        session.download("relative/path")
    assert session.screenshot(as_image=True).size == (800, 600)


async def test_async_exec_and_files(container_server: Server, session: Session) -> None:
    async with AsyncDeskbox(container_server.url, KEY_A) as box:
        same = await box.sessions.get(session.id)
        assert (await same.exec(["echo", "hi"])).stdout == "hi\n"
        await same.upload("/tmp/async.txt", b"async")
        assert await same.download("/tmp/async.txt") == b"async"


def test_cli_exec_round(container_server: Server, session: Session) -> None:
    from .test_cli import deskbox

    done = deskbox(container_server, "exec", session.id, "--", "sh", "-c",
                   "echo hi; echo oops >&2; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, "hi\n", "oops\n")
    listed = deskbox(container_server, "exec", session.id, "--json", "--", "ls", "-d", "/tmp")
    assert listed.returncode == 0 and json.loads(listed.stdout)["stdout"] == "/tmp\n"
    timed = deskbox(container_server, "exec", session.id, "--timeout-s", "1", "--", "sleep", "9")
    assert timed.returncode == 124


def test_a_focused_field_looks_the_same_in_every_screenshot(container_server: Server) -> None:
    """The session image's browser keeps its caret steady (/etc/gtk-3.0/settings.ini):
    screenshots of one state 0.3 s apart are the same picture. A blinking caret toggles
    every 0.5 s, so some of them would differ."""
    with Deskbox(container_server.url, KEY_A) as box, box.sessions.create(
        display={"width": 800, "height": 600},
        start_url="data:text/html,<title>caret</title><input autofocus>",
    ) as session:
        session.type("caret")
        time.sleep(0.3)
        looks = []
        for _ in range(6):
            looks.append(session.screenshot())
            time.sleep(0.3)
        assert len(set(looks)) == 1, f"{len(set(looks))} different pictures of one state"


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_pause_hibernate_snapshot_and_fork(container_server: Server) -> None:
    with Deskbox(container_server.url, KEY_A) as box, box.sessions.create(
        display={"width": 800, "height": 600},
        start_url="data:text/html,<title>sdk</title><input autofocus>",
    ) as session:
        session.type("forked text")
        assert session.pause().state == "paused"
        with pytest.raises(Conflict):
            session.click(10, 10)
        assert session.resume().state == "running"
        assert session.hibernate().state == "hibernated"
        assert session.resume().state == "running"

        snapshot = session.snapshot()
        assert snapshot.id.startswith("snap_")
        assert box.snapshots.get(snapshot.id).raw["session_id"] == session.id
        assert snapshot.id in [s.id for s in box.snapshots.list()]
        with box.sessions.create(from_snapshot=snapshot.id) as copy:
            assert copy.state == "running" and copy.id != session.id
            assert copy.data.display.width == 800
        box.snapshots.delete(snapshot.id)
        with pytest.raises(NotFound):
            box.snapshots.get(snapshot.id)

        copies = session.fork(2)
        try:
            assert len({c.id for c in copies} | {session.id}) == 3
            assert all(c.state == "running" for c in copies)
            shots = [c.screenshot(as_image=True) for c in copies]
            assert all(shot.size == (800, 600) for shot in shots)
        finally:
            for copy in copies:
                copy.close()
