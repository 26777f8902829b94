"""The ``deskbox`` command (the installed entry point) against a real server, local backend."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from deskbox._commands import EXIT_CODES
from deskbox._table import render_table

from .conftest import KEY_A, Server

DESKBOX = str(Path(sys.executable).parent / "deskbox")


def deskbox(server: Server | None, *args: str, key: str = KEY_A,
            url: str | None = None, columns: int | None = 250,
            extra_env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DESKBOX, *args], capture_output=True, text=True,
                          env={**cli_env(server, key, url, columns), **(extra_env or {})},
                          stdin=subprocess.DEVNULL, timeout=60, check=False)


def cli_env(server: Server | None, key: str = KEY_A, url: str | None = None,
            columns: int | None = 250) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    env["DESKBOX_URL"] = url or (server.url if server else "")
    env["DESKBOX_API_KEY"] = key
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return env


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


@pytest.mark.parametrize("columns", [60, 200])
def test_ls_shows_every_id_whole(local_server: Server, session_id: str, columns: int) -> None:
    listed = deskbox(local_server, "ls", "--label", "suite=cli", columns=columns)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert [row.split()[0] for row in rows] == [session_id]
    assert all(len(line.rstrip()) <= columns for line in listed.stdout.splitlines())
    if columns == 200:
        assert header.split() == ["ID", "STATE", "BACKEND", "DISPLAY", "CREATED", "LABELS"]
        assert rows[0].split()[1:4] == ["running", "local", "640x480"]
    else:  # the less useful columns give way
        assert header.split() == ["ID", "STATE", "LABELS"]
        assert rows[0].split() == [session_id, "running", "suite=cli"]


@pytest.mark.parametrize("args", [("--wide",), ()])
def test_ls_wide_or_piped_shows_every_column(
    local_server: Server, session_id: str, args: tuple[str, ...]
) -> None:
    """--wide on a 60-column terminal, or a pipe without COLUMNS: every column, one line each."""
    listed = deskbox(local_server, "ls", "--label", "suite=cli", *args,
                     columns=60 if args else None)
    header, row = listed.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "BACKEND", "DISPLAY", "CREATED", "LABELS"]
    assert row.split()[:4] == [session_id, "running", "local", "640x480"]
    assert row.split()[-1] == "suite=cli"


def test_show_keeps_ids_and_urls_whole(local_server: Server, session_id: str) -> None:
    shown = deskbox(local_server, "show", session_id, columns=40)
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    body = json.loads(deskbox(local_server, "show", session_id, "--json").stdout)
    assert fields["id"] == session_id and fields["display"] == "640x480"
    assert fields["urls.view"] == body["urls"]["view"] and len(body["urls"]["view"]) > 40


def test_ls_on_a_narrow_terminal(local_server: Server, session_id: str) -> None:
    """A real 40-column terminal (pty), no COLUMNS: ids whole, nothing cut with '…'."""
    reader, writer = pty.openpty()
    fcntl.ioctl(writer, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    try:
        process = subprocess.Popen([DESKBOX, "ls", "--label", "suite=cli"],
                                   env=cli_env(local_server, columns=None),
                                   stdin=subprocess.DEVNULL, stdout=writer, stderr=writer)
    finally:
        os.close(writer)
    data = b""
    try:
        while select.select([reader], [], [], 30)[0]:
            try:
                chunk = os.read(reader, 65536)
            except OSError:  # EIO: the command exited
                break
            if not chunk:
                break
            data += chunk
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(reader)
    text = re.sub(r"\x1b\[[0-9;]*m", "", data.decode()).replace("\r\n", "\n")
    lines = text.splitlines()
    assert lines[0].split() == ["ID", "STATE"] and lines[1].split() == [session_id, "running"]
    assert "…" not in text


def test_ls_table_keeps_ids_whole_at_any_width() -> None:
    rows = [
        ("ses_032bc517f3b0123456789a", "hibernated", "container", "1280x800",
         "2026-12-01T02:40:06.488123Z", "suite=cli, owner=alice, purpose=a long label value"),
        ("ses_ffffffffffffffffffff", "running", "local", "640x480", "2026-12-01T02:41:06Z",
         "[red]x=y"),
    ]
    for width in [*range(1, 130), 200, None]:
        buffer = io.StringIO()
        render_table(buffer, rows, width)
        lines = buffer.getvalue().splitlines()
        assert [line.split()[0] for line in lines if not line.startswith(" ")] == [
            "ID", rows[0][0], rows[1][0]], (width, lines)
        narrowest = len(rows[0][0]) + 2 + len("hibernated")  # ID and STATE, never left out
        assert all(len(line.rstrip()) <= max(width or 999, narrowest) for line in lines)
        assert "…" not in buffer.getvalue()
        if width is None or width >= 80:
            assert "[red]x=y" in buffer.getvalue()  # a label, not rich markup
    whole = io.StringIO()
    render_table(whole, rows, None)  # --wide, or a pipe: every column, one line a session
    assert whole.getvalue().splitlines()[1].split() == [*rows[0][:5], *rows[0][5].split()]


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
    # An id that would not stay one path segment, a screenshot to a directory that does
    # not exist: usage errors with a message, not tracebacks.
    bad_id = deskbox(local_server, "show", "a/b")
    assert bad_id.returncode == 2 and "not an id or name" in bad_id.stderr, bad_id.stderr
    nowhere = deskbox(local_server, "screenshot", session_id, "-o", "/nonexistent/dir/x.png")
    assert nowhere.returncode == 2 and "cannot write" in nowhere.stderr, nowhere.stderr
    assert "Traceback" not in bad_id.stderr + nowhere.stderr
    # The local backend refuses exec (422); pause & co. are refused or work.
    assert deskbox(local_server, "exec", session_id, "--", "true").returncode == 7
    paused = deskbox(local_server, "pause", session_id)
    assert paused.returncode in (0, 5, 6, 7), paused.stderr
    if paused.returncode == 0:
        assert deskbox(local_server, "resume", session_id).returncode == 0


def test_files_that_cannot_be_written_are_usage_errors(
    local_server: Server, session_id: str, tmp_path: Path,
) -> None:
    """act --screenshot, export -o and eval --out to a place that cannot be written ended in
    a traceback (act's after its actions had run)."""
    nowhere = "/nonexistent/dir/out"
    moved = deskbox(local_server, "act", session_id, '{"type": "move", "x": 7, "y": 8}',
                    "--screenshot", nowhere)
    assert moved.returncode == EXIT_CODES["usage"] and "cannot write" in moved.stderr
    position = deskbox(local_server, "act", session_id, '{"type": "cursor_position"}')
    assert json.loads(position.stdout)["results"] != [{"x": 7, "y": 8}]  # checked first
    exported = deskbox(local_server, "export", session_id, "-o", nowhere)
    assert exported.returncode == EXIT_CODES["usage"] and "cannot write" in exported.stderr
    task = Path(__file__).parents[2] / "tasks" / "click-button.yaml"
    (tmp_path / "agent.py").write_text("def agent(observation, instruction):\n    return []\n")
    evaluated = subprocess.run(
        [DESKBOX, "eval", str(task), "--agent", "agent.py:agent", "--out", nowhere],
        capture_output=True, text=True, cwd=tmp_path, env=cli_env(local_server),
        stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert evaluated.returncode == 2 and "cannot write" in evaluated.stderr
    for done in (moved, exported, evaluated):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
            done.stderr


def test_deskbox_max_retries_makes_the_cli_wait_out_a_full_server(one_per_key: Server) -> None:
    first = deskbox(one_per_key, "create", "--no-wait")
    assert first.returncode == 0, first.stderr
    try:
        started = time.monotonic()
        refused = deskbox(one_per_key, "create", extra_env={"DESKBOX_MAX_RETRIES": "1"})
        assert refused.returncode == EXIT_CODES["capacity"], refused.stderr
        assert time.monotonic() - started >= 1.0  # sent again once, after Retry-After
        malformed = deskbox(one_per_key, "ls", extra_env={"DESKBOX_MAX_RETRIES": "many"})
        assert malformed.returncode == EXIT_CODES["usage"]
        assert "DESKBOX_MAX_RETRIES must be a whole number" in malformed.stderr
        mcp = deskbox(one_per_key, "mcp", extra_env={"DESKBOX_MAX_RETRIES": "-1"})
        assert mcp.returncode == EXIT_CODES["usage"] and "Traceback" not in mcp.stderr
    finally:
        assert deskbox(one_per_key, "rm", first.stdout.strip()).returncode == 0


def test_create_no_wait_then_rm(local_server: Server) -> None:
    made = deskbox(local_server, "create", "--no-wait", "--json")
    assert made.returncode == 0, made.stderr
    body = json.loads(made.stdout)
    assert body["state"] == "starting"
    removed = deskbox(local_server, "rm", body["id"])
    assert removed.returncode == 0 and removed.stdout.strip() == body["id"]
    assert deskbox(local_server, "rm", body["id"]).returncode == 0  # idempotent


def test_record_and_export(local_server: Server, tmp_path: Path) -> None:
    made = deskbox(local_server, "create", "--width", "640", "--height", "480", "--record",
                   "--start-url", "data:text/html,<body>recorded</body>")
    assert made.returncode == 0, made.stderr
    sid = made.stdout.strip()
    try:
        assert deskbox(local_server, "act", sid, '{"type": "click", "x": 30, "y": 40}'
                       ).returncode == 0
        stopped = deskbox(local_server, "record", sid, "--stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"{sid} stopped (1 actions")
        archive, video = tmp_path / "r.zip", tmp_path / "r.mp4"
        assert deskbox(local_server, "export", sid, "-o", str(archive)).returncode == 0
        with zipfile.ZipFile(archive) as zipped:
            lines = zipped.read("trajectory.jsonl").decode().splitlines()
        clicks = [e for e in map(json.loads, lines) if e["kind"] == "action"]
        assert clicks[0]["action"] == {"type": "click", "x": 30, "y": 40}
        exported = deskbox(local_server, "export", sid, "--video", "-o", str(video), "--json")
        assert exported.returncode == 0, exported.stderr
        assert video.read_bytes()[4:8] == b"ftyp"  # an MP4 container
        assert json.loads(exported.stdout)["size"] == video.stat().st_size
        assert deskbox(local_server, "record", sid).returncode == 0  # it goes on
    finally:
        deskbox(local_server, "rm", sid)
    missing = deskbox(local_server, "export", "ses_00000000000000000000")
    assert missing.returncode == EXIT_CODES["not_found"]
