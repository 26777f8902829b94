"""Checkpoints of a sandbox whose browser holds open TCP connections to a server running
inside it (a task's local web app): snapshot, fork and hibernate keep them.

They were refused for as long as the browser kept its connections (minutes), with CRIU's
hint to use a flag the API does not offer. With egress `none` both ends of every
connection are in the dump (engines/runc/criu.py). Real runc, CRIU, Chromium and a Python
HTTP server in the sandbox, through the SDK and the API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from deskbox import Deskbox, Session, cdp
from deskbox_server.engines.runc.criu import Criu

from ..api.conftest import KEY_A, Server, running_server
from .test_snapshots import settings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(Criu().missing() is not None,
                       reason="CRIU 4.1 is not installed (scripts/criu.sh)"),
]

# HTTP/1.0 without a length: the page ends when the server closes each connection.
SERVER = b"""
import http.server
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body><input id=field></body></html>")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), Page).serve_forever()
"""
URL = "http://127.0.0.1:8000/"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(settings(tmp_path_factory.mktemp("connections-state"))) as running:
        yield running


@pytest.fixture
def box(server: Server) -> Iterator[Deskbox]:
    with Deskbox(server.url, api_key=KEY_A, timeout=120) as client:
        yield client


def _open_connections(session: Session) -> int:
    table = session.exec(["cat", "/proc/net/tcp", "/proc/net/tcp6"]).stdout
    return sum(1 for line in table.splitlines() if line.split()[3:4] == ["01"])


def _serving(box: Deskbox) -> Session:
    """A session whose browser shows a page of a server inside it, with text typed."""
    session = box.sessions.create(display={"width": 800, "height": 600})
    session.upload("/tmp/page_server.py", SERVER)
    session.exec(["python3", "/tmp/page_server.py"], background=True)
    deadline = time.monotonic() + 10
    while session.exec(["python3", "-c", f"import urllib.request; urllib.request.urlopen("
                                         f"{URL!r})"]).exit_code != 0:
        assert time.monotonic() < deadline, "the server in the sandbox did not start"
        time.sleep(0.1)
    # Twice: on its second visit Chromium opens connections ahead (its predictor), which it
    # keeps open for minutes.
    cdp.navigate(session, URL)
    cdp.navigate(session, URL)
    cdp.evaluate(session, "document.getElementById('field').value = 'typed'")
    return session


def _field(session: Session) -> str:
    value = cdp.evaluate(session, "document.getElementById('field').value")
    assert isinstance(value, str)
    return value


def test_snapshot_fork_and_hibernate_keep_the_browsers_connections(box: Deskbox) -> None:
    source = _serving(box)
    try:
        assert _open_connections(source) > 0  # else this test would show nothing
        snapshot = source.snapshot()
        with box.sessions.create(from_snapshot=snapshot.id) as copy:
            assert _field(copy) == "typed"
            # The copy's own server answers its page, a fresh request after the restore.
            assert cdp.evaluate(copy, f"fetch({URL!r}).then(r => r.status)") == 200
        box.snapshots.delete(snapshot.id)

        [forked] = source.fork(1)
        with forked:
            assert _field(forked) == "typed"

        assert _open_connections(source) > 0
        source.hibernate()
        source.resume()
        assert _field(source) == "typed"
        assert cdp.evaluate(source, f"fetch({URL!r}).then(r => r.status)") == 200
    finally:
        source.close()

