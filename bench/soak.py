"""Churn: sessions made, driven and ended in a loop; what the server keeps of them.

Run from the repository root (root, runc, CRIU)::

    .venv/bin/python bench/soak.py [--cycles 200] [--every 25] [--parallel 1]

Starts ``deskbox serve`` like bench/api.py (container engine). Each cycle creates a
session, sends 20 websocket clicks and a screenshot, types, runs a command, uploads and
downloads 100 kB, asks the browser and its page something over DevTools, takes a frame
through the live view (VNC), then in turns hibernates and resumes it, freezes and thaws
it, or forks two copies and deletes them, takes a screenshot and deletes it;
``--parallel`` clients run cycles at once. Every ``--every`` cycles it samples the server
process (resident memory, threads, open descriptors, children) and the host (runc
containers, mounts of its sessions), and at the end prints those samples, the memory the
server gained per 100 sessions over the second half of the run (the first half includes
its warm-up: imports, caches, the allocator's high-water mark), and what was left once the
server stopped. Ended sessions stay listed as ``stopped`` (a small record each) for
``DESKBOX_ENDED_SESSION_TTL_H``, so some growth is by design.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from api import (  # bench/api.py
    create,
    interrupt_on_sigterm,
    server,
    server_pid,
    status_field,
)
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.rfb_client import RfbViewer  # noqa: E402

PAGE = "data:text/html,<body style='background:%23080'><input autofocus></body>"
UPLOAD = b"x" * 100_000


@dataclass(frozen=True)
class Sample:
    cycles: int
    sessions: int
    seconds: float
    rss_mib: float
    threads: int
    fds: int
    children: int
    containers: int
    mounts: int


def _containers() -> int:
    done = subprocess.run(["runc", "list", "-q"], capture_output=True, text=True, check=False)
    return len(done.stdout.split())


def _mounts() -> int:
    """Mounts of deskbox's but the session images' (each image stays mounted once built)."""
    with open("/proc/self/mounts") as mounts:
        return sum(1 for line in mounts if ("deskbox" in line or "dbx" in line)
                   and "/images/" not in line.split()[1])


def _children(pid: int) -> int:
    done = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                          check=False)
    return len(done.stdout.split())


def sample(pid: int, cycles: int, sessions: int, started: float) -> Sample:
    return Sample(
        cycles=cycles, sessions=sessions, seconds=time.monotonic() - started,
        rss_mib=status_field(pid, "VmRSS") / 1024, threads=status_field(pid, "Threads"),
        fds=len(os.listdir(f"/proc/{pid}/fd")), children=_children(pid),
        containers=_containers(), mounts=_mounts(),
    )


def _ok(response: httpx.Response, status: int = 200) -> httpx.Response:
    if response.status_code != status:
        raise SystemExit(f"{response.request.method} {response.request.url.path}: "
                         f"{response.status_code} {response.text[:500]}")
    return response


def _websocket_base(http: httpx.Client) -> tuple[str, dict[str, str]]:
    """The server's websocket URL and the headers that authenticate to it."""
    return (str(http.base_url).replace("http://", "ws://", 1),
            {"Authorization": http.headers["Authorization"]})


def _websocket_clicks(http: httpx.Client, session: str) -> None:
    url, auth = _websocket_base(http)
    with connect(f"{url}/v1/sessions/{session}/actions/ws", additional_headers=auth) as ws:
        for number in range(20):
            ws.send(json.dumps({"id": number, "action": {"type": "click", "x": 200, "y": 20}}))
            reply = json.loads(ws.recv())
            if not reply.get("ok"):
                raise SystemExit(f"click: {reply}")
        ws.send(json.dumps({"id": 20, "action": {"type": "screenshot", "format": "jpeg"}}))
        reply = json.loads(ws.recv())
        if not reply.get("ok"):
            raise SystemExit(f"screenshot: {reply}")
        for _ in range(int(reply.get("binary_frames", 0))):
            ws.recv()


def _devtools(http: httpx.Client, session: str) -> None:
    """The browser's version over its DevTools socket, then a sum in its page's."""
    url, auth = _websocket_base(http)
    base = f"/v1/sessions/{session}/cdp"
    pages = [t for t in _ok(http.get(f"{base}/json/list")).json() if t["type"] == "page"]
    if not pages:
        raise SystemExit("DevTools listed no page")
    calls = [(f"{url}{base}", "Browser.getVersion", {}),
             (pages[0]["webSocketDebuggerUrl"], "Runtime.evaluate", {"expression": "6 * 7"})]
    for socket_url, method, params in calls:
        with connect(socket_url, additional_headers=auth, max_size=None) as ws:
            ws.send(json.dumps({"id": 1, "method": method, "params": params}))
            while "id" not in (reply := json.loads(ws.recv(timeout=10))):
                pass  # an event
            if "result" not in reply:
                raise SystemExit(f"DevTools {method}: {reply}")
    if reply["result"]["result"].get("value") != 42:
        raise SystemExit(f"DevTools evaluate: {reply}")


def _live_view(http: httpx.Client, session: str) -> None:
    url, auth = _websocket_base(http)
    with RfbViewer(f"{url}/v1/sessions/{session}/vnc", timeout_s=20,
                   additional_headers=auth) as viewer:
        frame = viewer.full_frame()
    if frame.shape[:2] != (viewer.height, viewer.width) or not frame.any():
        raise SystemExit("the live view gave no frame")


def cycle(http: httpx.Client, number: int) -> int:
    """One session's life; how many sessions it made (forks count)."""
    session = create(http, PAGE)
    made = 1
    base = f"/v1/sessions/{session}"
    _websocket_clicks(http, session)
    _ok(http.post(f"{base}/actions", json={"type": "type", "text": "héllo wörld"}))
    ran = _ok(http.post(f"{base}/exec", json={"cmd": ["sh", "-c", "echo hi"]})).json()
    if ran["stdout"] != "hi\n":
        raise SystemExit(f"exec: {ran}")
    _ok(http.put(f"{base}/files", params={"path": "/tmp/upload"}, content=UPLOAD))
    if _ok(http.get(f"{base}/files", params={"path": "/tmp/upload"})).content != UPLOAD:
        raise SystemExit("a download did not give the upload back")
    _devtools(http, session)
    _live_view(http, session)
    turn = number % 3
    if turn == 0:
        _ok(http.post(f"{base}/pause", json={"mode": "hibernate"}))
        _ok(http.post(f"{base}/resume"))
    elif turn == 1:
        _ok(http.post(f"{base}/pause", json={"mode": "freeze"}))
        _ok(http.post(f"{base}/resume"))
    else:
        copies = _ok(http.post(f"{base}/fork", json={"count": 2}), 201).json()["sessions"]
        made += len(copies)
        for copy in copies:
            _ok(http.delete(f"/v1/sessions/{copy['id']}"), 204)
    _ok(http.get(f"{base}/screenshot"))
    _ok(http.delete(base), 204)
    return made


def _leftovers() -> str:
    done = subprocess.run(["pgrep", "-af", "criu|deskbox-session|pasta|conmon"],
                          capture_output=True, text=True, check=False)
    processes = [line for line in done.stdout.splitlines() if "pgrep" not in line]
    return (f"{_containers()} runc containers, {_mounts()} session mounts, "
            f"{len(processes)} CRIU/pasta/session processes")


def render(samples: list[Sample]) -> None:
    print("| cycles | sessions made | s | server RSS MiB | threads | open fds | children "
          "| runc containers | session mounts |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in samples:
        print(f"| {s.cycles} | {s.sessions} | {s.seconds:.0f} | {s.rss_mib:.1f} | {s.threads} "
              f"| {s.fds} | {s.children} | {s.containers} | {s.mounts} |")
    middle = next((s for s in samples if s.cycles >= samples[-1].cycles / 2), samples[-1])
    last = samples[-1]
    if last.sessions > middle.sessions:
        growth = (last.rss_mib - middle.rss_mib) / (last.sessions - middle.sessions) * 100
        print(f"\nServer memory over the second half: {growth:+.2f} MiB per 100 sessions "
              f"({middle.sessions} → {last.sessions} sessions).")


class Churn:
    """``cycles`` cycles on ``parallel`` clients at once, sampled every ``every`` cycles."""

    def __init__(self, http: httpx.Client, pid: int, cycles: int, every: int) -> None:
        self.http, self.pid, self.cycles, self.every = http, pid, cycles, every
        self.started = time.monotonic()
        self.samples = [sample(pid, 0, 0, self.started)]
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._next = self._done = self._made = 0

    def _take(self) -> int | None:
        with self._lock:
            if self.failure is not None or self._next == self.cycles:
                return None
            self._next += 1
            return self._next - 1

    def client(self) -> None:
        http = self.http
        with httpx.Client(base_url=http.base_url, headers=http.headers,
                          timeout=http.timeout) as own:
            while (number := self._take()) is not None:
                try:
                    made = cycle(own, number)
                except SystemExit as failure:
                    with self._lock:
                        self.failure = self.failure or str(failure)
                    return
                with self._lock:
                    self._done += 1
                    self._made += made
                    if self._done % self.every == 0 or self._done == self.cycles:
                        self.samples.append(sample(self.pid, self._done, self._made,
                                                   self.started))
                        print(f"{self._done} cycles, {self._made} sessions, server RSS "
                              f"{self.samples[-1].rss_mib:.1f} MiB", file=sys.stderr,
                              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--every", type=int, default=25, help="sample after this many cycles")
    parser.add_argument("--parallel", type=int, default=1, help="clients cycling at once")
    args = parser.parse_args()
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-soak-") as scratch:
        # Its access log is a line per request: kept out of the terminal, shown on failure.
        log = Path(scratch) / "server.log"
        with server(Path(scratch) / "state", log=log) as http:
            churn = Churn(http, server_pid(http), args.cycles, args.every)
            clients = [threading.Thread(target=churn.client, name=f"client-{n}")
                       for n in range(args.parallel)]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            if churn.failure is not None:
                print(*log.read_text().splitlines()[-30:], sep="\n", file=sys.stderr)
                raise SystemExit(churn.failure)
        after = _leftovers()
    print(f"{args.parallel} client(s) at once.\n")
    render(churn.samples)
    print(f"\nOnce the server stopped: {after}.")


if __name__ == "__main__":
    main()
