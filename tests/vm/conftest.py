"""VM sessions: the guest is built (minutes, once: kernel, initramfs, beside the shared
session image) before any test's deadline starts, and one server with two VMs serves the
package: ``vm.session`` (egress none, on the event page) and ``vm.allowlisted`` (egress
allowlist to the peer network's allowed service); a second server's warm pool keeps a
third VM ready (test_vm_warm_pool.py, last). test_vm_egress_all.py boots a fourth, without
a browser, through the engine.

Under software emulation a VM takes a minute or two of CPU to paint its first page: all
three boot at once when the package starts. (Booting them beside the rest of the suite, at
nice 5, saved no time on 2 busy cores and made timing-sensitive tests flaky.)

The servers are ``deskbox serve`` subprocesses (test_vm_sessions.py kills one with SIGKILL);
what the tests look at on the host (QEMU's process, its runtime directory, cgroups) is found
from the session ids."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox_server.engines.image import build_image
from deskbox_server.engines.vm.cgroup import VmCgroup
from deskbox_server.engines.vm.qemu import VmPaths
from deskbox_server.engines.vm.sandbox import runtime_root
from deskbox_server.settings import default_recipe_dir

from ..api.sandbox_page import events_data_url
from ..api.served import reap, serve
from ..images import IMAGE_STATE_DIR, progress
from ..peer_network import (
    HostServices,
    Peer,
    host_services_listening,
    peer_addresses,
    peer_network,
)
from ..scratch import scratch_dir

BOOT_TIMEOUT_S = 900.0


def vm_guest() -> Path:
    """The current recipe's VM guest directory (``images/vm-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress, timeout_s=1800,
                       script_name="vm_guest.py")


def qemu_pids(parent: int | None = None) -> list[int]:
    """Running QEMU processes (children of ``parent``: the VM's jail)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            if (name.startswith("qemu-system") and state != "Z"
                    and (parent is None or int(ppid) == parent)):
                pids.append(int(entry.name))
    return pids


def quota_us(cgroup: VmCgroup) -> int | None:
    """The CPU quota of a VM's cgroup (us per 100 ms), None when it has none."""
    if cgroup.v1:
        quota = int((cgroup.directories[0] / "cpu.cfs_quota_us").read_text())
        return None if quota < 0 else quota
    limit = (cgroup.directories[0] / "cpu.max").read_text().split()[0]
    return None if limit == "max" else int(limit)


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in /proc/{pid}/status")


class Vm:
    """The package's VM sessions and the server that runs them now (a restart swaps it)."""

    def __init__(self, state_dir: Path, log: Path, stack: contextlib.ExitStack) -> None:
        self.state_dir, self.log, self._stack = state_dir, log, stack
        self.http: httpx.Client | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.session: dict[str, Any] = {}
        self.allowlisted: dict[str, Any] = {}
        self.orphans: list[int] = []  # jails that reparented to us when a server died

    def start_server(self) -> None:
        self.process, self.http = self._stack.enter_context(
            serve(self.state_dir, self.log, SERVER_ENV, timeout_s=300.0))

    def kill_server(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.orphans.append(self.leader())

    @property
    def client(self) -> httpx.Client:
        assert self.http is not None
        return self.http

    @property
    def id(self) -> str:
        return str(self.session["id"])

    def paths(self, session_id: str | None = None) -> VmPaths:
        return VmPaths(runtime_root(self.state_dir) / (session_id or self.id))

    def cgroup(self, session_id: str | None = None) -> VmCgroup:
        return VmCgroup(f"deskbox-vm-{runtime_root(self.state_dir).name}-{session_id or self.id}")

    def leader(self, session_id: str | None = None) -> int:
        """The pid of the VM's jail (QEMU's parent), from its pid file."""
        return int(self.paths(session_id).pid.read_text())

    def qemu(self, session_id: str | None = None) -> int:
        (pid,) = qemu_pids(self.leader(session_id))
        return pid


SERVER_ENV = {"DESKBOX_BACKENDS": "vm,container", "DESKBOX_DEFAULT_BACKEND": "vm",
              "DESKBOX_DESKTOP_CALL_TIMEOUT_S": "60",
              # Three VMs booting at once on 2 cores take longer than the engine's floor.
              "DESKBOX_START_TIMEOUT_S": "1500"}
# A second server, whose warm pool keeps one VM ready (test_vm_warm_pool.py).
POOL_ENV = {"DESKBOX_BACKENDS": "vm", "DESKBOX_DEFAULT_BACKEND": "vm", "DESKBOX_POOL_SIZE": "1",
            "DESKBOX_DESKTOP_CALL_TIMEOUT_S": "60", "DESKBOX_START_TIMEOUT_S": "1500"}
PEER_INDEX = 1  # the package's peer network: its own, beside tests/isolation's


@dataclass
class PoolServer:
    process: subprocess.Popen[bytes]
    client: httpx.Client
    state_dir: Path


class VmServers:
    """The package's servers and their three VMs."""

    def __init__(self, base: Path) -> None:
        self.stack = contextlib.ExitStack()
        self.stack.callback(shutil.rmtree, base / "state", ignore_errors=True)
        self.vm = Vm(base / "state", base / "server.log", self.stack)
        self.stack.callback(lambda: reap(self.vm.orphans))
        self.started: dict[str, str] = {}
        self.stack.callback(shutil.rmtree, base / "pool-state", ignore_errors=True)
        try:
            self.pool = PoolServer(*self.stack.enter_context(serve(
                base / "pool-state", base / "pool-server.log", POOL_ENV, timeout_s=300.0)),
                base / "pool-state")
            self._start()
        except BaseException:
            self.stack.close()
            raise

    def _start(self) -> None:
        self.vm.start_server()
        _, allowed, _ = peer_addresses(PEER_INDEX)
        bodies = {
            "session": {"display": {"width": 1280, "height": 800},
                        "browser": {"start_url": events_data_url()}, "timeout_s": 7200},
            "allowlisted": {"network": {"egress": "allowlist", "allow": [allowed]},
                            "timeout_s": 7200},
        }
        self.stack.callback(self._delete)  # runs before the server stops
        for name, body in bodies.items():
            response = self.vm.client.post("/v1/sessions", params={"wait": "false"}, json=body)
            assert response.status_code == 201, response.text
            self.started[name] = response.json()["id"]

    def _delete(self) -> None:  # if a test failed first; the server may be gone already
        for session_id in self.started.values():
            with contextlib.suppress(httpx.HTTPError, RuntimeError, AssertionError):
                self.vm.client.delete(f"/v1/sessions/{session_id}")

    def close(self) -> None:
        self.stack.close()


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        vm_guest()


@pytest.fixture(scope="package")
def peer() -> Iterator[Peer]:
    with peer_network(PEER_INDEX) as made:
        yield made


@pytest.fixture(scope="package")
def host_services() -> Iterator[HostServices]:
    with host_services_listening() as services:
        yield services


@pytest.fixture(scope="package")
def servers(request: pytest.FixtureRequest) -> Iterator[VmServers]:
    with contextlib.closing(VmServers(scratch_dir(request, "deskbox-vm-tests-"))) as started:
        yield started


@pytest.fixture(scope="package")
def vm(servers: VmServers) -> Vm:
    for name, session_id in servers.started.items():
        setattr(servers.vm, name, running(servers.vm.client, session_id))
    return servers.vm


@pytest.fixture(scope="package")
def pool_server(vm: Vm, servers: VmServers) -> PoolServer:
    return servers.pool


def running(client: httpx.Client, session_id: str) -> dict[str, Any]:
    """The session once it runs (AssertionError with its failure if it does not)."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while True:
        body: dict[str, Any] = client.get(f"/v1/sessions/{session_id}").json()
        assert body["state"] in ("starting", "running"), body
        if body["state"] == "running":
            return body
        assert time.monotonic() < deadline, f"{session_id} did not start: {body}"
        time.sleep(0.5)
