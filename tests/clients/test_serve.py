"""``deskbox serve`` as a person and as a log collector see it: a real server process on a
pseudo-terminal (readable lines, a start banner whose curl works as printed) or on pipes
(JSON lines). The local backend and no session: nothing to build, a start takes ~1 s."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from deskbox_server.serve import banner

from .conftest import KEY_A

DESKBOX = str(Path(sys.executable).parent / "deskbox")
TEXT_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO|WARNING|ERROR) +[\w.]+  \S")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TOKEN = "dbt_leakedTOKEN0123"


class Output:
    """What the server wrote so far, read as it comes (pty master or pipe)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.data.decode(errors="replace").replace("\r\n", "\n"))

    def wait_for(self, done: Callable[[str], bool], timeout_s: float = 30) -> str:
        deadline = time.monotonic() + timeout_s
        while not done(self.text):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; output so far:\n{self.text[-3000:]}"
            if select.select([self.fd], [], [], left)[0]:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: the pty's other side closed (the server exited)
                    chunk = b""
                assert chunk, f"the server's output ended:\n{self.text[-3000:]}"
                self.data += chunk
        return self.text

    def drain(self) -> None:
        """Everything left until the writer closes (after the server exited)."""
        while select.select([self.fd], [], [], 5)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            self.data += chunk


def serve_env(keys: str | None = None) -> dict[str, str]:
    """This environment without its DESKBOX_ settings, on the local backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    env |= {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}
    env.pop("NO_COLOR", None)
    if keys is not None:
        env["DESKBOX_API_KEYS"] = keys
    return env


@contextmanager
def serve(tmp_path: Path, *args: str, tty: bool,
          keys: str | None = None) -> Iterator[Output]:
    """``deskbox serve --port 0`` on a pty (stdout and stderr) or on a pipe; stopped with
    SIGINT (Ctrl-C) at the end, which must exit 0. After the block, ``text`` holds all the
    server wrote."""
    env = serve_env(keys)
    # A space in the path: the banner's curl must quote the key file's path.
    argv = [DESKBOX, "serve", "--port", "0", "--state-dir", str(tmp_path / "my state"), *args]
    if tty:
        reader, writer = pty.openpty()
    else:
        reader, writer = os.pipe()
    try:
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=writer,
                                   stderr=writer)
    finally:
        os.close(writer)
    output = Output(reader)
    try:
        yield output
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        output.drain()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(reader)


def websocket_with_a_token(url: str) -> None:
    """A live-view websocket with a session token in its query (uvicorn logs its URL)."""
    with pytest.raises(InvalidStatus):
        connect(f"ws{url.removeprefix('http')}/v1/sessions/ses_0123abcd/vnc?token={TOKEN}")


def run_as_printed(command: str, env: dict[str, str] | None = None) -> Any:
    """The banner's curl through a shell, exactly as a user pastes it."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})}, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_serve_on_a_terminal_prints_text_and_a_curl_that_works(tmp_path: Path) -> None:
    with serve(tmp_path, tty=True) as output:
        text = output.wait_for(lambda t: "\nTry it: " in t and t.endswith("\n\n"))
        url = re.search(r"^Deskbox serves (http://127\.0\.0\.1:\d+)$", text, re.M)
        assert url, text
        key_file = (tmp_path / "my state" / "api_key").resolve()
        assert f"API key: in {key_file} " in text
        curl = re.search(r"^Try it: (curl .*)$", text, re.M)
        assert curl and f"$(cat {shlex.quote(str(key_file))})" in curl[1], text
        assert run_as_printed(curl[1]) == {"sessions": [], "next_cursor": None}

        # A request with a token in its query: its access line, without the query.
        response = httpx.get(f"{url[1]}/v1/sessions?token=dbt_leakedQUERY0123",
                             headers={"Authorization": f"Bearer {key_file.read_text().strip()}"})
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        missing = httpx.get(f"{url[1]}/v1/sessions/ses_0123abcd",
                            headers={"Authorization": f"Bearer {key_file.read_text().strip()}"})
        assert missing.status_code == 404
        websocket_with_a_token(url[1])
        output.wait_for(lambda t: request_id in t and missing.headers["x-request-id"] in t
                        and "WebSocket /v1/sessions/ses_0123abcd/vnc?token=[redacted]" in t)
    text = output.text
    key = key_file.read_text().strip()
    assert key not in text and "dbt_leakedQUERY0123" not in text and TOKEN not in text
    logged = [line for line in text.splitlines() if line and not line.startswith(
        ("Deskbox serves ", "API key: ", "Try it: "))]
    assert logged and all(TEXT_LINE.match(line) for line in logged), logged
    assert not any(line.startswith("{") for line in text.splitlines())
    access = [line for line in logged if request_id in line]
    assert len(access) == 1 and " deskbox.access  GET /v1/sessions 200  " in access[0]
    assert f"request_id={request_id}" in access[0] and "duration_ms=" in access[0]
    # A session's calls carry its id as a field, to follow one session through the log.
    assert [line for line in logged if "session_id=ses_0123abcd" in line] == [
        line for line in logged if " deskbox.access  " in line and "/ses_0123abcd" in line]
    # The curl's own request was logged too (the banner's key file worked).
    assert sum(" GET /v1/sessions 200 " in line for line in logged) == 2


def test_serve_on_a_pipe_prints_json_lines(tmp_path: Path) -> None:
    with serve(tmp_path, tty=False, keys=KEY_A) as output:
        output.wait_for(lambda t: '"deskbox.serve"' in t and t.endswith("\n"))
        lines = [json.loads(line) for line in output.text.splitlines()]
        start = [entry for entry in lines if entry["logger"] == "deskbox.serve"]
        assert len(start) == 1 and start[0]["api_keys"] == "DESKBOX_API_KEYS"
        assert start[0]["url"].startswith("http://127.0.0.1:")
        assert start[0]["curl"] == ('curl -H "Authorization: Bearer $DESKBOX_API_KEY" '
                                    f"{start[0]['url']}/v1/sessions")
        assert run_as_printed(start[0]["curl"], {"DESKBOX_API_KEY": KEY_A}) == {
            "sessions": [], "next_cursor": None}
        missing = httpx.get(f"{start[0]['url']}/v1/sessions/ses_0123abcd",
                            headers={"Authorization": f"Bearer {KEY_A}"})
        assert missing.status_code == 404
        websocket_with_a_token(start[0]["url"])
        output.wait_for(lambda t: missing.headers["x-request-id"] in t and "token=[redacted]" in t
                        and t.endswith("\n"))
    text = output.text
    entries = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert {"time", "level", "logger", "message"} <= set(entries[0])
    access = [entry for entry in entries if entry["logger"] == "deskbox.access"]
    assert access[0]["message"] == "GET /v1/sessions 200"
    assert access[0]["request_id"].startswith("req_") and access[0]["status"] == 200
    assert access[1]["session_id"] == "ses_0123abcd" and "session_id" not in access[0]
    assert KEY_A not in text and TOKEN not in text


@pytest.mark.parametrize(("tty", "log_format"), [(True, "json"), (False, "text")])
def test_log_format_overrides_the_terminal_check(
    tmp_path: Path, tty: bool, log_format: str
) -> None:
    with serve(tmp_path, "--log-format", log_format, tty=tty) as output:
        output.wait_for(lambda t: "/v1/sessions" in t and t.endswith("\n"))
    lines = [line for line in output.text.splitlines() if line]
    if log_format == "json":
        entries = [json.loads(line) for line in lines]
        start = [entry for entry in entries if entry["logger"] == "deskbox.serve"]
        assert len(start) == 1 and start[0]["api_key_file"].endswith("/my state/api_key")
        assert start[0]["curl"].startswith('curl -H "Authorization: Bearer $(cat ')
    else:
        assert any(line.startswith("Try it: curl ") for line in lines)
        assert sum(bool(TEXT_LINE.match(line)) for line in lines) >= 4
        assert not any(line.startswith("{") for line in lines)


def test_banner_dials_loopback_for_a_wildcard_host() -> None:
    assert banner("0.0.0.0", 8765, None).url == "http://127.0.0.1:8765"
    assert banner("::", 8765, None).url == "http://[::1]:8765"
    assert banner("fd00::1", 80, None).url == "http://[fd00::1]:80"
    assert banner("deskbox.internal", 8765, None).curl == (
        'curl -H "Authorization: Bearer $DESKBOX_API_KEY" http://deskbox.internal:8765/v1/sessions')


def test_a_server_that_cannot_start_says_why_in_one_line(tmp_path: Path) -> None:
    """A reason of ours (here: another server on the state dir) is one line, not uvicorn's
    traceback through every lifespan frame; the exit status is 3."""
    with serve(tmp_path, tty=False) as output:
        output.wait_for(lambda t: '"deskbox.serve"' in t and t.endswith("\n"))
        second = subprocess.run(
            [DESKBOX, "serve", "--port", "0", "--state-dir", str(tmp_path / "my state"),
             "--log-format", "text"],
            env=serve_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=60, check=False)
    said = second.stdout + second.stderr
    assert second.returncode == 3, said
    assert re.search(r"^\S+ ERROR +uvicorn  cannot start: another Deskbox server is using the "
                     r"state dir .*my state$", said, re.M), said
    assert "Traceback" not in said and len(said.splitlines()) < 10, said
