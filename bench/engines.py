"""The engines side by side, in one run (issue 17): runc (``container``), ``docker``
against Podman's Docker-compatible service (started here, with storage of its own), and
``kubernetes`` against the tests' stand-in API server (tests/kubernetes/standin.py), whose
pods are containers in that same Podman, each in a network namespace of its own.

Run from the repository root (root; builds the session image and the OCI image first if
missing, and loads the OCI image into the new storage)::

    .venv/bin/python bench/engines.py [--iterations 30] [--creates 3]

For each backend, in one server (``DESKBOX_BACKENDS=container,docker,kubernetes``): create
→ running (the create's answer) and → the start page painted in a screenshot, over
``--creates`` sessions; REST screenshot (JPEG q75) and click round trips; the idle session's
PSS (its processes, from ``/proc/PID/smaps_rollup``). The stand-in is not a cluster: no
scheduler, no image pull, no CNI; what it adds over docker is the pod's API round trips and
TCP to a pod IP. Prints a markdown table with each engine's ratio to runc; every session is
deleted, the server and the stand-in stopped and Podman's storage removed on exit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from api import (  # bench/api.py (this script's directory)
    HEIGHT,
    PAINTED_PAGE,
    REPO,
    WIDTH,
    interrupt_on_sigterm,
    print_side_by_side,
    pss_mib,
    pss_of,
    rest_round_trips,
    server,
    shows_colour,
)

sys.path.insert(0, str(REPO))
from tests.docker.podman import Podman, podman_service  # noqa: E402 (the tests' own service)
from tests.images import oci_image  # noqa: E402
from tests.kubernetes.standin import standin_process  # noqa: E402

NAMESPACE = "deskbox-bench"

Figures = dict[str, list[float]]


def create(http: httpx.Client, backend: str) -> tuple[str, float, float]:
    """A session on the painted page: its id, seconds to running and to the page shown."""
    started = time.perf_counter()
    response = http.post("/v1/sessions", json={
        "backend": backend, "display": {"width": WIDTH, "height": HEIGHT},
        "browser": {"start_url": PAINTED_PAGE},
    })
    if response.status_code != 201:
        raise SystemExit(f"create ({backend}): {response.status_code} {response.text}")
    session_id: str = response.json()["id"]
    created = time.perf_counter() - started
    while True:
        shot = http.get(f"/v1/sessions/{session_id}/screenshot",
                        params={"format": "jpeg", "quality": 50, "scale": "320x200"})
        shot.raise_for_status()
        if shows_colour(shot.content):
            return session_id, created, time.perf_counter() - started
        time.sleep(0.02)


def container_pss_mib(podman: Podman, name: str) -> float:
    """PSS of a Podman container's processes: those of its cgroup (cgroupfs:
    ``…/libpod_parent/libpod-<id>``)."""
    container = podman.cli("inspect", "--format", "{{.Id}}", name).stdout.strip()
    pids: set[int] = set()
    for procs in Path("/sys/fs/cgroup").glob(f"*/*/*{container}*/cgroup.procs"):
        pids |= {int(pid) for pid in procs.read_text().split()}
    if not pids:
        raise SystemExit(f"no cgroup with processes for the container {name}")
    return pss_of(pids)


def session_pss_mib(podman: Podman, standin: str, backend: str, session_id: str) -> float:
    if backend == "container":
        return pss_mib(session_id)
    if backend == "docker":
        (name,) = [name for name in podman.cli("ps", "--format", "{{.Names}}").stdout.split()
                   if name.endswith(session_id)]
        return container_pss_mib(podman, name)
    pod = httpx.get(f"{standin}/api/v1/namespaces/{NAMESPACE}/pods/deskbox-"
                    + session_id.replace("_", "-")).json()
    return container_pss_mib(podman, f"standin-{pod['metadata']['uid']}")


def measure(http: httpx.Client, podman: Podman, standin: str, backend: str, iterations: int,
            creates: int) -> Figures:
    figures: Figures = {"create → running (s)": [], "create → page painted (s)": []}
    made = []
    try:
        for _ in range(creates):
            session_id, created, painted = create(http, backend)
            made.append(session_id)
            figures["create → running (s)"].append(created)
            figures["create → page painted (s)"].append(painted)
        time.sleep(2.0)  # idle: let the start-up's work settle before memory and timings
        figures["PSS of the idle session (MiB)"] = [
            session_pss_mib(podman, standin, backend, made[-1])]
        figures.update(rest_round_trips(http, made[-1], iterations))
    finally:
        for session_id in made:
            http.delete(f"/v1/sessions/{session_id}")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--creates", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10 iterations, 2 creates")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.creates = 10, 2
    if args.iterations < 1 or args.creates < 1:
        raise SystemExit("--iterations and --creates must be at least 1")
    interrupt_on_sigterm()
    # The image the docker engine loads into Podman at the server's start, which the
    # stand-in's pods then run.
    image = json.loads((oci_image() / "manifest.json").read_text())["name"]
    with podman_service() as podman, \
            tempfile.TemporaryDirectory(prefix="deskbox-bench-engines-") as tmp, \
            standin_process(podman.url, Path(tmp) / "standin.log") as standin:
        env = {"DESKBOX_BACKENDS": "container,docker,kubernetes",
               "DESKBOX_DOCKER_HOST": podman.url, "DESKBOX_KUBERNETES_API": standin,
               "DESKBOX_KUBERNETES_NAMESPACE": NAMESPACE, "DESKBOX_KUBERNETES_IMAGE": image}
        print("the first start loads the OCI image into Podman's new storage...",
              file=sys.stderr)
        with server(Path(tmp) / "state", env, Path(tmp) / "server.log") as http:
            http.timeout = httpx.Timeout(300.0)
            daemon = http.get("/healthz").json()["engines"]["docker"]["details"]["daemon"]
            results = {backend: measure(http, podman, standin, backend, args.iterations,
                                        args.creates)
                       for backend in ("container", "docker", "kubernetes")}
    print(f"### Engines side by side, one run (docker: {daemon}; kubernetes: the stand-in)\n")
    print_side_by_side(results, {"container": "container (runc)", "docker": "docker",
                                 "kubernetes": "kubernetes (stand-in)"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
