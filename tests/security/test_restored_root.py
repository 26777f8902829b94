"""Issue 13, part 1: a restored sandbox must not be able to write the image every session
runs. The attack, through the API as a tenant would: make a copy by each path that
restores a checkpoint (fork, from_snapshot, a snapshot-pool copy, hibernate -> resume),
then from inside it try to write ``/`` and replace ``/usr/bin/python3``.

Before the fix the copy printed ``RW`` and its root was the host's cached image directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.mounts import parse_mountinfo, signature
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox
from deskbox_server.engines.runc.snapshot import restore_copy, take_snapshot

from ..api.conftest import Server
from ..images import IMAGE_STATE_DIR, REPO, session_image
from ..sandbox_agent import until_ready

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

PAGE = {"start_url": "data:text/html,<body style='background:%23cfc'>restored</body>"}
# What a hostile copy runs: is / writable, can it add a file, can it replace python3.
ATTACK = (
    "test -w / && echo RW; "
    "echo pwned > /pwned && echo WROTE-ROOT; "
    "echo pwned > /usr/bin/python3 && echo WROTE-PYTHON; "
    "echo pwned > /usr/local/bin/deskbox-session && echo WROTE-LAUNCHER; "
    "exit 0"
)


def run(client: httpx.Client, session_id: str, script: str) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{session_id}/exec",
                           json={"cmd": ["sh", "-c", script], "timeout_s": 30})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def mount_table(client: httpx.Client, session_id: str) -> list[tuple[str, str, str, str]]:
    """The sandbox's mounts as its own processes see them, without ids or devices."""
    result = run(client, session_id, "cat /proc/self/mountinfo")
    assert result["exit_code"] == 0, result
    return signature(parse_mountinfo(result["stdout"].strip()))


def create(client: httpx.Client, **body: Any) -> str:
    response = client.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def assert_cannot_write_the_image(
    client: httpx.Client, session_id: str, fresh: list[tuple[str, str, str, str]]
) -> None:
    attack = run(client, session_id, ATTACK)
    assert attack["exit_code"] == 0, attack
    assert "RW" not in attack["stdout"].split(), attack
    assert "WROTE" not in attack["stdout"], attack
    assert "Read-only file system" in attack["stderr"], attack
    assert mount_table(client, session_id) == fresh


@pytest.fixture(scope="module")
def source(client: httpx.Client) -> Iterator[tuple[str, list[tuple[str, str, str, str]]]]:
    session_id = create(client, browser=PAGE)
    try:
        yield session_id, mount_table(client, session_id)
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def test_a_fresh_session_cannot_write_its_root(
    client: httpx.Client, source: tuple[str, list[tuple[str, str, str, str]]]
) -> None:
    session_id, fresh = source
    root = [entry for entry in fresh if entry[0] == "/"]
    # The image itself is read-only: erofs has no write support at all.
    assert root and root[0][1] == "erofs" and "ro" in root[0][2].split(","), root
    assert_cannot_write_the_image(client, session_id, fresh)


def test_a_fork_copy_cannot_write_the_image(
    client: httpx.Client, source: tuple[str, list[tuple[str, str, str, str]]]
) -> None:
    session_id, fresh = source
    response = client.post(f"/v1/sessions/{session_id}/fork", json={"count": 1})
    assert response.status_code == 201, response.text
    copy = response.json()["sessions"][0]["id"]
    try:
        assert_cannot_write_the_image(client, copy, fresh)
    finally:
        client.delete(f"/v1/sessions/{copy}")


def test_copies_from_a_snapshot_and_its_pool_cannot_write_the_image(
    client: httpx.Client, server: Server,
    source: tuple[str, list[tuple[str, str, str, str]]],
) -> None:
    session_id, fresh = source
    snapshot = client.post(f"/v1/sessions/{session_id}/snapshots")
    assert snapshot.status_code == 201, snapshot.text
    snapshot_id = snapshot.json()["id"]
    try:
        copy = create(client, from_snapshot=snapshot_id)
        try:
            assert_cannot_write_the_image(client, copy, fresh)
        finally:
            client.delete(f"/v1/sessions/{copy}")

        pooled = client.put(f"/v1/snapshots/{snapshot_id}/pool", json={"size": 1})
        assert pooled.status_code == 200, pooled.text
        deadline = time.monotonic() + 90
        while client.get(f"/v1/snapshots/{snapshot_id}").json()["pool"]["ready"] < 1:
            assert time.monotonic() < deadline, "the snapshot's pool did not fill"
            time.sleep(0.2)
        pool = server.services.manager.pool
        assert pool is not None
        claimed = pool.claimed
        copy = create(client, from_snapshot=snapshot_id)
        try:
            assert pool.claimed == claimed + 1  # a pool copy, restored ahead of the create
            assert_cannot_write_the_image(client, copy, fresh)
        finally:
            client.delete(f"/v1/sessions/{copy}")
    finally:
        assert client.delete(f"/v1/snapshots/{snapshot_id}").status_code == 204


def test_a_resumed_hibernated_session_cannot_write_the_image(
    client: httpx.Client, source: tuple[str, list[tuple[str, str, str, str]]]
) -> None:
    _, fresh = source
    session_id = create(client, browser=PAGE)
    try:
        paused = client.post(f"/v1/sessions/{session_id}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200, paused.text
        resumed = client.post(f"/v1/sessions/{session_id}/resume")
        assert resumed.status_code == 200, resumed.text
        assert_cannot_write_the_image(client, session_id, fresh)
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def test_the_image_matches_its_build_after_the_attacks() -> None:
    """Every file of the image against the content manifest written when it was built."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("deskbox")), "image", "verify",
         "--state-dir", str(IMAGE_STATE_DIR)],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    assert "every file matches its build" in done.stderr


def test_a_copy_without_a_user_namespace_is_repaired_before_it_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Without a user namespace (the mode of egress all/allowlist sessions) CRIU restores
    the root read-write and the masks on the host's /dev/null: the seal repairs both
    (mount_repair.py) before any task runs, and the copy's mounts are the source's."""
    options = RuncOptions(
        state_dir=tmp_path_factory.mktemp("no-userns-state"), rootfs=session_image(),
        user_ids=None,
    )
    # Checkpointed once the agent says the desktop is ready, as the API would: a browser
    # still starting has file descriptors in flight on its sockets, which CRIU refuses.
    source = until_ready(RuncSandbox.start(options, f"no-userns-{os.getpid()}"))
    copy = None
    try:
        assert source.init_pid is not None
        fresh = signature(parse_mountinfo(Path(f"/proc/{source.init_pid}/mountinfo").read_text()))
        snapshot = tmp_path_factory.mktemp("no-userns-snapshot") / "snap"
        take_snapshot(source, Criu(), snapshot, packed=False)
        copy = restore_copy(options, f"no-userns-copy-{os.getpid()}", snapshot, Criu())
        assert copy.init_pid is not None
        table = Path(f"/proc/{copy.init_pid}/mountinfo").read_text()
        assert signature(parse_mountinfo(table)) == fresh
        attack = subprocess.run(
            [*options.runc.command(), "exec", copy.container_id, "sh", "-c", ATTACK],
            capture_output=True, text=True, timeout=30, check=False,
        )
        assert "RW" not in attack.stdout.split() and "WROTE" not in attack.stdout, attack
    finally:
        if copy is not None:
            copy.destroy()
        source.destroy()
