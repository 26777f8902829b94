"""The ``deskbox`` command (the installed entry point) against a real server, local backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from deskbox._commands import EXIT_CODES

from .conftest import KEY_A, Server

DESKBOX = str(Path(sys.executable).parent / "deskbox")


def deskbox(server: Server | None, *args: str, key: str = KEY_A,
            url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    env["DESKBOX_URL"] = url or (server.url if server else "")
    env["DESKBOX_API_KEY"] = key
    env["COLUMNS"] = "250"  # rich tables: no truncated ids
    return subprocess.run([DESKBOX, *args], capture_output=True, text=True, env=env,
                          timeout=60, check=False)


def image_info(path: Path) -> tuple[tuple[int, int], str | None]:
    with Image.open(path) as image:
        return image.size, image.format


@pytest.fixture(scope="module")
def session_id(local_server: Server) -> Iterator[str]:
    made = deskbox(local_server, "create", "--width", "640", "--height", "480",
                   "--label", "suite=cli", "--start-url", "data:text/html,<body>cli</body>")
    assert made.returncode == 0, made.stderr
    session_id = made.stdout.strip()
    assert session_id.startswith("ses_")
    try:
        yield session_id
    finally:
        deskbox(local_server, "rm", session_id)


def test_ls_show_and_json(local_server: Server, session_id: str) -> None:
    table = deskbox(local_server, "ls", "--label", "suite=cli")
    assert table.returncode == 0 and session_id in table.stdout and "running" in table.stdout
    listed = json.loads(deskbox(local_server, "ls", "--json").stdout)
    assert [s for s in listed if s["id"] == session_id][0]["labels"] == {"suite": "cli"}
    shown = deskbox(local_server, "show", session_id)
    assert shown.returncode == 0 and "640x480" in shown.stdout
    body = json.loads(deskbox(local_server, "show", session_id, "--json").stdout)
    assert body["id"] == session_id and body["display"]["width"] == 640


def test_screenshot_and_act(local_server: Server, session_id: str, tmp_path: Path) -> None:
    out = tmp_path / "shot.png"
    saved = deskbox(local_server, "screenshot", session_id, "-o", str(out))
    assert saved.returncode == 0, saved.stderr
    assert image_info(out) == ((640, 480), "PNG")
    jpeg = tmp_path / "shot.jpg"
    assert deskbox(local_server, "screenshot", session_id, "-o", str(jpeg)).returncode == 0
    assert image_info(jpeg) == ((640, 480), "JPEG")

    done = deskbox(local_server, "act", session_id,
                   '[{"type": "click", "x": 30, "y": 40}, {"type": "cursor_position"}]')
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"results": [{}, {"x": 30, "y": 40}]}
    settled = tmp_path / "settled.png"
    one = deskbox(local_server, "act", session_id, '{"type": "move", "x": 5, "y": 6}',
                  "--screenshot", str(settled))
    assert one.returncode == 0 and image_info(settled)[0] == (640, 480)
    assert json.loads(one.stdout)["screenshot"]["width"] == 640


def test_view_prints_a_link_with_a_token(local_server: Server, session_id: str) -> None:
    shown = deskbox(local_server, "view", session_id)
    assert shown.returncode == 0
    link = shown.stdout.strip()
    assert link.startswith(local_server.url) and "/view?token=" in link
    assert "?token=" in json.loads(deskbox(local_server, "view", session_id, "--control",
                                           "--json").stdout)["url"]


def test_exit_codes(local_server: Server, session_id: str) -> None:
    assert EXIT_CODES == {"ok": 0, "error": 1, "usage": 2, "connection": 3, "auth": 4,
                          "not_found": 5, "conflict": 6, "invalid": 7, "capacity": 8,
                          "server": 9}
    missing = deskbox(local_server, "show", "ses_nope")
    assert missing.returncode == 5 and "not_found" in missing.stderr
    wrong = deskbox(local_server, "ls", key="wrong-key")
    assert wrong.returncode == 4
    as_json = deskbox(local_server, "show", "ses_nope", "--json")
    assert json.loads(as_json.stderr)["error"]["type"] == "not_found"
    assert deskbox(None, "ls", url="http://127.0.0.1:9").returncode == 3
    assert deskbox(local_server, "act", session_id, "{not json").returncode == 2
    assert deskbox(local_server, "act", session_id, '{"type": "nope"}').returncode == 7
    assert deskbox(local_server, "create", "--label", "novalue").returncode == 2
    assert deskbox(local_server, "frobnicate").returncode == 2
    # The local backend refuses exec (422); pause & co. are refused or work.
    assert deskbox(local_server, "exec", session_id, "--", "true").returncode == 7
    paused = deskbox(local_server, "pause", session_id)
    assert paused.returncode in (0, 5, 6, 7), paused.stderr
    if paused.returncode == 0:
        assert deskbox(local_server, "resume", session_id).returncode == 0


def test_create_no_wait_then_rm(local_server: Server) -> None:
    made = deskbox(local_server, "create", "--no-wait", "--json")
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    assert body["state"] == "starting"
    removed = deskbox(local_server, "rm", body["id"])
    assert removed.returncode == 0 and removed.stdout.strip() == body["id"]
    assert deskbox(local_server, "rm", body["id"]).returncode == 0  # idempotent
