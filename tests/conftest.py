"""Suite-wide checks: nothing a test started may outlive the suite, checked once when
`make test` runs two pytest-xdist workers (each file's tests on one: the Makefile)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deskbox_server.engines.processes import become_subreaper

from .docker.podman import Podman, podman_service


def _live_descendants(root: int) -> list[str]:
    """Processes below ``root`` that still run (zombies excluded), as "pid name"."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[str, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_bytes()
        except OSError:
            continue
        name = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
        fields = raw[raw.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        info[int(entry.name)] = (name, fields[0])
    found: list[str] = []
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        name, state = info[pid]
        if state != b"Z":
            found.append(f"{pid} {name}")
        stack.extend(children.get(pid, []))
    return found


PREFIX = "deskbox-"  # container ids, cgroups and network namespaces of sandboxes


def _sandbox_traces() -> set[str]:
    """Sandbox state the kernel, runc and QEMU keep: containers, cgroups, netns, mounts,
    X locks, VM runtime directories; and the servers' scratch directories."""
    traces: set[str] = set()
    runc_root = Path("/run/runc")
    if runc_root.is_dir():
        traces |= {f"runc:{p.name}" for p in runc_root.iterdir() if p.name.startswith(PREFIX)}
    for controller in Path("/sys/fs/cgroup").iterdir():
        if controller.is_dir():
            traces |= {
                f"cgroup:{controller.name}/{p.name}"
                for p in controller.iterdir()
                if p.is_dir() and p.name.startswith(PREFIX)
            }
    netns = Path("/run/netns")
    if netns.is_dir():
        traces |= {f"netns:{p.name}" for p in netns.iterdir() if p.name.startswith(PREFIX)}
    shared = Path("/run/deskbox")  # the sandboxes' small shared tmpfs directories
    if shared.is_dir():
        traces |= {f"shared:{p.name}" for p in shared.iterdir() if p.name.startswith(PREFIX)}
    # VMs' runtime directories (sockets, fw_cfg files): /run/deskbox-vm/<server>/<session>.
    vm_root = Path("/run/deskbox-vm")
    if vm_root.is_dir():
        traces |= {f"vm:{p.parent.name}/{p.name}" for p in vm_root.glob("*/*")}
    # Temp dirs of browsers started on the host (a killed Chromium leaves them behind).
    traces |= {f"tmp:{p.name}" for p in Path("/tmp").glob("org.chromium.Chromium.*")}
    # The servers' scratch directories for checkpoint images (server/deskbox_server/scratch.py).
    traces |= {f"scratch:{p.name}" for p in Path("/dev/shm").glob("deskbox-*")}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1]
        if "/sessions/" in target or PREFIX in target:
            traces.add(f"mount:{target}")
    return traces


_TRACES_BEFORE = pytest.StashKey[set[str]]()


def _is_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (``make test`` runs two): the controller checks the host."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Before collection: whatever a collection hook starts counts as the suite's."""
    become_subreaper()
    # The SDK's calls in the tests run with its defaults, whatever the developer's shell says.
    os.environ.pop("DESKBOX_MAX_RETRIES", None)
    session.config.stash[_TRACES_BEFORE] = _sandbox_traces()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Sandbox state of the host is checked once every worker is done (a worker that ends
    first would see the other's sandboxes)."""
    runs_workers = bool(getattr(session.config.option, "numprocesses", None))  # -n N
    if runs_workers and not _is_worker(session.config):
        traces = _sandbox_traces() - session.config.stash[_TRACES_BEFORE]
        if traces:
            writer = session.config.get_terminal_writer()
            writer.line()  # after the progress dots
            writer.line(f"sandbox state outlived the suite: {sorted(traces)}", red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def nothing_survives_the_suite(request: pytest.FixtureRequest) -> Iterator[None]:
    """Everything a test starts must be gone at the end: processes and sandbox state.

    As a subreaper, this process inherits whatever a desktop leaves orphaned, so a leaked
    process shows up below us rather than vanishing under PID 1. Sandbox state found before
    the suite (another run on the same host) is not ours and is left out.
    """
    before = request.config.stash[_TRACES_BEFORE]
    yield
    deadline = time.monotonic() + 5
    while (left := _live_descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes outlived the suite: {left}"
    if _is_worker(request.config):
        return  # the controller checks the host once all workers are done
    traces = _sandbox_traces() - before
    assert not traces, f"sandbox state outlived the suite: {sorted(traces)}"


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """One Podman service (the Docker-compatible Engine API) for the suite: the docker
    engine's containers and the Kubernetes stand-in's pods run in it, and the OCI image is
    loaded into its storage once."""
    with podman_service() as service:
        yield service
