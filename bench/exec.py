"""``exec`` of ``true`` through the HTTP API of a running server (container backend).

Run from the repository root (root, runc)::

    .venv/bin/python bench/exec.py [--iterations 200]

Starts ``deskbox serve`` like bench/api.py, creates one session, then times
``POST /v1/sessions/{id}/exec {"cmd": ["true"]}`` on one keep-alive connection, after a
few warm-up calls. Prints p50/p95 in ms. The session is deleted and the server stopped on
exit.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from api import create, interrupt_on_sigterm, p95, server  # bench/api.py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    args = parser.parse_args()
    interrupt_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="deskbox-bench-exec-") as scratch, server(
        Path(scratch) / "state"
    ) as http:
        session = create(http)
        try:
            for _ in range(5):
                http.post(f"/v1/sessions/{session}/exec", json={"cmd": ["true"]}).raise_for_status()
            samples = []
            for _ in range(args.iterations):
                started = time.perf_counter()
                response = http.post(f"/v1/sessions/{session}/exec", json={"cmd": ["true"]})
                samples.append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                assert response.json()["exit_code"] == 0, response.text
        finally:
            http.delete(f"/v1/sessions/{session}")
    print("| exec `true` | p50 ms | p95 ms | n |")
    print("|---|---|---|---|")
    print(f"| through the API | {statistics.median(samples):.1f} | {p95(samples):.1f} "
          f"| {len(samples)} |")


if __name__ == "__main__":
    main()
