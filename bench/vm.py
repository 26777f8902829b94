"""VM sessions beside container sessions, in one run (issue 16).

Run from the repository root (root; builds the session image and the VM guest first if
missing)::

    .venv/bin/python bench/vm.py [--iterations 30] [--forks 4]

Starts ``deskbox serve`` with both engines (``DESKBOX_BACKENDS=container,vm``) and, for each
backend in turn, measures:

- create → the agent listening (the sandbox booted: ``agent_listening`` of the start
  timings in the server's log) → running (the create call answers once the desktop is
  ready: the browser's window painted) → the start page in a screenshot (its colour);
- screenshot (JPEG q75) and click round trips through REST;
- pause/resume (freeze), hibernate/resume, and a fork into ``--forks`` copies (all running
  when it answers);
- PSS of the idle session: the processes of its cgroup (the container's, or QEMU and its
  jail), from ``/proc/PID/smaps_rollup``.

Every VM figure is labelled with the accelerator the server reports in ``GET /healthz``
(TCG on this project's hosts, whose ``/dev/kvm`` is kvm-pvm): no KVM figure is printed
unless it ran on KVM. Prints a markdown table with the VM/container ratio; every session is
deleted and the server stopped on exit.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from api import (  # bench/api.py (this script's directory)
    HEIGHT,
    PAINTED_PAGE,
    WIDTH,
    interrupt_on_sigterm,
    print_side_by_side,
    pss_mib,
    rest_round_trips,
    server,
    shows_colour,
)

Figures = dict[str, list[float]]


def agent_listening_s(log: Path, session_id: str) -> float:
    """Seconds from the create to the sandbox's agent listening, from the server's log line
    ``session ID running (engine E, T s; agent_listening S s, ...)``."""
    for line in log.read_text(errors="replace").splitlines():
        if f"session {session_id} running" in line:
            match = re.search(r"agent_listening ([0-9.]+) s", line)
            if match:
                return float(match.group(1))
    raise SystemExit(f"no start timings of {session_id} in {log}")


def create(http: httpx.Client, backend: str) -> tuple[str, float, float]:
    """A session of ``backend`` on the painted page: its id, seconds to the create's answer
    (running) and to the first screenshot showing the page."""
    started = time.perf_counter()
    response = http.post("/v1/sessions", json={
        "backend": backend, "display": {"width": WIDTH, "height": HEIGHT},
        "browser": {"start_url": PAINTED_PAGE},
    })
    response.raise_for_status()
    session_id: str = response.json()["id"]
    created = time.perf_counter() - started
    while True:
        shot = http.get(f"/v1/sessions/{session_id}/screenshot",
                        params={"format": "jpeg", "quality": 50, "scale": "320x200"})
        shot.raise_for_status()
        if shows_colour(shot.content):
            return session_id, created, time.perf_counter() - started
        time.sleep(0.05)


def once(call: Callable[[], httpx.Response]) -> float:
    started = time.perf_counter()
    response = call()
    if response.status_code >= 300:
        raise SystemExit(f"{response.request.url}: {response.status_code} {response.text}")
    return time.perf_counter() - started


def measure(http: httpx.Client, log: Path, backend: str, iterations: int, forks: int
            ) -> Figures:
    figures: Figures = {}
    session_id, created, painted = create(http, backend)
    base = f"/v1/sessions/{session_id}"
    try:
        figures["create → agent listening (s)"] = [agent_listening_s(log, session_id)]
        figures["create → running: the create's answer (s)"] = [created]
        figures["create → page painted in a screenshot (s)"] = [painted]
        time.sleep(2.0)  # idle: let the start-up's work settle before memory and timings
        figures["PSS of the idle session (MiB)"] = [pss_mib(session_id)]
        figures.update(rest_round_trips(http, session_id, iterations))
        freeze, thaw = [], []
        for _ in range(3):
            freeze.append(1000 * once(lambda: http.post(f"{base}/pause",
                                                         json={"mode": "freeze"})))
            thaw.append(1000 * once(lambda: http.post(f"{base}/resume")))
        figures["pause freeze (ms)"], figures["resume from freeze (ms)"] = freeze, thaw
        figures["hibernate (s)"] = [once(lambda: http.post(f"{base}/pause",
                                                           json={"mode": "hibernate"}))]
        figures["resume from hibernation (s)"] = [once(lambda: http.post(f"{base}/resume"))]
        started = time.perf_counter()
        response = http.post(f"{base}/fork", json={"count": forks})
        if response.status_code != 201:
            raise SystemExit(f"fork: {response.status_code} {response.text}")
        figures[f"fork ×{forks}, all running (s)"] = [time.perf_counter() - started]
        for copy in response.json()["sessions"]:
            http.delete(f"/v1/sessions/{copy['id']}")
    finally:
        http.delete(base)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--forks", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="10 iterations, fork ×2")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.forks = 10, 2
    interrupt_on_sigterm()
    env = {"DESKBOX_BACKENDS": "container,vm", "DESKBOX_MAX_SESSIONS": "12",
           "DESKBOX_MAX_SESSIONS_PER_KEY": "12", "DESKBOX_DESKTOP_CALL_TIMEOUT_S": "120"}
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-vm-") as tmp, \
            server(Path(tmp) / "state", env, Path(tmp) / "server.log") as http:
        http.timeout = httpx.Timeout(600.0)
        vm = http.get("/healthz").json()["engines"]["vm"]["details"]
        accelerator = vm["accelerator"].upper()
        log = Path(tmp) / "server.log"
        results = {backend: measure(http, log, backend, args.iterations, args.forks)
                   for backend in ("container", "vm")}
    print(f"### VM sessions ({accelerator}) beside container sessions, one run\n")
    print(f"VM accelerator: **{accelerator}** ({vm['accelerator_reason']}).\n")
    print_side_by_side(results, {"container": "container (runc)", "vm": f"vm ({accelerator})"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
