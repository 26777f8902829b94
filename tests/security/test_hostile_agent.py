"""Issue 14: the agent is hostile too. A session whose agent misbehaves fails alone.

Each case runs a real session whose agent a process of the sandbox replaced
(tests/impostors.py): the impostor (impostor_agent.py, run by the sandbox's python3)
answers the handshake after the restore, so the session resumes, then misbehaves on the
next desktop call (or exec): garbage where frames belong, a frame or a header block that
never ends, a parts reply claiming a 300 MiB image, an image larger than the one asked
for, no answer at all, an answer on a stream the host never opened or data before
headers, an endless body past every window, endless well-formed exec output, a reply
head nested too deep for ``json.loads``, a screen larger than any display, a status of
digits that are not ASCII, an exec record of an unknown kind.

In every case the call that met it gets a 502 ``session_failed`` within its deadline, the
session goes to ``failed`` with the reason (in the API and in its events), and the server
(/healthz), a neighbouring session (its screenshots as fast as before) and the server's
memory (this process's RSS: the server runs in it) carry on as they were. An impostor
silent in the handshake (no SETTINGS, or no answer to hello) fails the resume instead,
within the handshake's timeout; one whose last frame at a pause is not its screen fails
the pause, and its frozen sandbox goes.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from deskbox_server.agent import PROTOCOL
from deskbox_server.agent.desktop import IMAGE_SLACK
from deskbox_server.agent.limits import AgentLimits
from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.engine import RuncEngine
from deskbox_server.engines.runc.runtime import Runc

from ..impostors import failed_event, hibernate_resume, new_session, start_impostor, wait_failed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

PAGE = {"start_url": "data:text/html,<body style='background:%23080'>victim</body>"}
PROGRAM = (Path(__file__).parent / "impostor_agent.py").read_text()
CALL_TIMEOUT_S = 4.0  # the server's desktop_call_timeout_s: how long "silent" takes
MIB = 1 << 20
IMAGE_LIMIT = 64 * 48 * 4 + IMAGE_SLACK  # of the impostor's 64x48 screen
RSS_SLACK = 8 * MIB
SERVER_SETTINGS = {"desktop_call_timeout_s": CALL_TIMEOUT_S}  # conftest.py

# mode: what the reason of the session's failure says (the client's own words).
LIMITS = AgentLimits()
CASES = {
    "garbage": f"bytes, over the {LIMITS.max_frame_size} allowed",
    "huge_frame": f"a frame of type 0 announces 16777215 bytes, over the {LIMITS.max_frame_size}",
    "header_block": f"a header block over {LIMITS.max_header_block} bytes",
    "claims_300mib": f"act: results[0]: {300 * MIB} bytes at 0 (at most {IMAGE_LIMIT},",
    "image_too_big": f"act: results[0]: {IMAGE_LIMIT + 1} bytes at 0 (at most {IMAGE_LIMIT},",
    "silent": f"the desktop did not answer within {CALL_TIMEOUT_S:.0f} s (act)",
    "wrong_stream": "HTTP/2 protocol error",
    "out_of_order": "a desktop call answered 'application/json', not application/vnd.deskbox.parts",
    "act_flood": f"calls: act: a reply of {1 << 31} bytes",
    "exec_flood": "exec: more output than the 1048576 asked for",
    "deep_json": "calls: a reply head is not {status, content_type, size}",
    "huge_screen": "info: a screen of 16384x16384, over the 33177600 pixels",
    "bad_status": "a bad :status '2\u00b20'",  # the superscript two, as the reason shows it
    "bad_record": "exec: a bad record (kind b'z', 0 bytes)",
}
EXEC_MODES = {"exec_flood", "bad_status", "bad_record"}  # as impostor_agent.py's


class Neighbour:
    def __init__(self, client: httpx.Client, session_id: str) -> None:
        self.client, self.id = client, session_id
        self.before_ms = median_ms(self.shot)

    def shot(self) -> None:
        response = self.client.get(f"/v1/sessions/{self.id}/screenshot")
        assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def neighbour(client: httpx.Client) -> Iterator[Neighbour]:
    session_id = new_session(client, browser=PAGE)
    try:
        yield Neighbour(client, session_id)
    finally:
        client.delete(f"/v1/sessions/{session_id}")


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def median_ms(call: Callable[[], object], times: int = 10) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


@pytest.mark.parametrize("mode", list(CASES))
def test_a_hostile_agent_fails_only_its_own_session(
    client: httpx.Client, neighbour: Neighbour, mode: str
) -> None:
    victim = new_session(client, browser=PAGE)
    try:
        start_impostor(client, victim, PROGRAM, mode, str(PROTOCOL))
        resumed = hibernate_resume(client, victim)  # the host now talks to the impostor
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["state"] == "running"

        before = rss()
        started = time.monotonic()
        if mode in EXEC_MODES:
            response = client.post(f"/v1/sessions/{victim}/exec",
                                   json={"cmd": ["true"], "timeout_s": 30})
        else:
            response = client.get(f"/v1/sessions/{victim}/screenshot")
        elapsed = time.monotonic() - started
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["type"] == "session_failed" and CASES[mode] in error["message"], error
        assert elapsed < (CALL_TIMEOUT_S + 5 if mode == "silent" else 10), elapsed

        body = wait_failed(client, victim)
        failed_s = time.monotonic() - started
        reason = body["failure"]["reason"]
        assert CASES[mode] in reason, reason
        assert failed_event(client, victim).get("reason") == reason
        growth = rss() - before
        print(f"\nFIGURE {mode}: call {elapsed:.2f} s -> {response.status_code}, failed after "
              f"{failed_s:.2f} s, RSS {growth / MIB:+.1f} MiB; {reason}")
        assert growth < RSS_SLACK, f"the server grew by {growth / MIB:.1f} MiB"
    finally:
        client.delete(f"/v1/sessions/{victim}")
    carry_on(client, neighbour)


HANDSHAKE_S = 2.0  # the engine's handshake timeout in the two tests below (5 s as shipped)


@pytest.mark.parametrize(("mode", "wanted"), [
    ("mute", f"no HTTP/2 SETTINGS within {HANDSHAKE_S} s"),
    ("no_hello", "no answer to hello"),
])
def test_an_agent_silent_in_its_handshake_fails_the_resume(
    client: httpx.Client, neighbour: Neighbour, mode: str, wanted: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The resume waits for the handshake no longer than its timeout, then fails."""
    # Read for each new stream: the server runs in this process.
    monkeypatch.setattr(RuncEngine, "handshake_timeout_s", HANDSHAKE_S)
    victim = new_session(client, browser=PAGE)
    try:
        start_impostor(client, victim, PROGRAM, mode, str(PROTOCOL))
        resumed = hibernate_resume(client, victim)
        assert resumed.status_code == 502, resumed.text
        assert resumed.json()["error"]["type"] == "session_failed"
        seconds = resumed.elapsed.total_seconds()
        assert seconds < HANDSHAKE_S + 5, seconds
        reason = wait_failed(client, victim)["failure"]["reason"]
        assert wanted in reason, reason
        assert failed_event(client, victim).get("reason") == reason
        print(f"\nFIGURE {mode}: resume {seconds:.2f} s -> 502; {reason}")
    finally:
        client.delete(f"/v1/sessions/{victim}")
    carry_on(client, neighbour)


def test_a_bad_frame_at_a_pause_fails_only_its_own_session(
    client: httpx.Client, neighbour: Neighbour
) -> None:
    """The host unpacks a pause's last frame while the sandbox freezes: a frame that is not
    the screen's fails the pause and the session, frozen by then, and its sandbox goes."""
    victim = new_session(client, browser=PAGE)
    try:
        start_impostor(client, victim, PROGRAM, "bad_frame", str(PROTOCOL))
        resumed = hibernate_resume(client, victim)
        assert resumed.status_code == 200, resumed.text

        response = client.post(f"/v1/sessions/{victim}/pause", json={"mode": "freeze"})
        assert response.status_code == 502, response.text
        wanted = "grab: the deflated pixels are not 12288 bytes (64x48)"
        error = response.json()["error"]
        assert error["type"] == "session_failed" and wanted in error["message"], error
        assert wanted in wait_failed(client, victim)["failure"]["reason"]
        deadline = time.monotonic() + 30
        while [cid for cid in Runc().list_ids() if cid.endswith("-" + victim)]:
            assert time.monotonic() < deadline, "the failed session's sandbox is still there"
            time.sleep(0.2)
    finally:
        client.delete(f"/v1/sessions/{victim}")
    carry_on(client, neighbour)


def carry_on(client: httpx.Client, neighbour: Neighbour) -> None:
    """The server and the neighbour carry on as before (within the noise of a busy host)."""
    assert client.get("/healthz").status_code == 200
    after_ms = median_ms(neighbour.shot)
    assert after_ms < max(3 * neighbour.before_ms, neighbour.before_ms + 50), (
        neighbour.before_ms, after_ms)
