"""VM sessions: the guest is built (minutes, once: kernel, initramfs, beside the shared
session image) before any test's deadline starts, and one server with two VMs serves the
package: ``vm.session`` (egress none, on the event page) and ``vm.allowlisted`` (egress
allowlist to the peer network's allowed service); a second server's warm pool keeps a
third VM ready (test_vm_warm_pool.py).

Under software emulation a VM takes a minute or two of CPU to paint its first page, so all
start as soon as collection ends, at nice 5, and boot on what CPU the rest of the suite
leaves; when this package's first test comes, its server and VMs get their normal priority
back and the tests wait only for what is left of the boot.

The servers are ``deskbox serve`` subprocesses (test_vm_sessions.py kills one with SIGKILL);
what the tests look at on the host (QEMU's process, its runtime directory, cgroups) is found
from the session ids."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
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
from ..images import IMAGE_STATE_DIR, _progress
from ..peer_network import (
    HostServices,
    Peer,
    host_services_listening,
    peer_addresses,
    peer_network,
)

BOOT_TIMEOUT_S = 420.0


def vm_guest() -> Path:
    """The current recipe's VM guest directory (``images/vm-<hash>/``), built if missing."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), _progress, timeout_s=1800,
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


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def descendants(root: int) -> list[int]:
    """The processes below ``root``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(
                    int(entry.name))
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def renice(root: int, value: int) -> None:
    """A process and all it started (QEMU's threads included) at niceness ``value``."""
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():  # niceness is per thread
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, int(task.name), value)


class Vm:
    """The package's VM sessions and the server that runs them now (a restart swaps it)."""

    def __init__(self, state_dir: Path, log: Path, stack: contextlib.ExitStack) -> None:
        self.state_dir, self.log, self._stack = state_dir, log, stack
        self.http: httpx.Client | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.session: dict[str, Any] = {}
        self.allowlisted: dict[str, Any] = {}
        self.orphans: list[int] = []  # jails that reparented to us when a server died

    def start_server(self, nice: int = 0) -> None:
        self.process, self.http = self._stack.enter_context(
            serve(self.state_dir, self.log, SERVER_ENV, timeout_s=300.0, nice=nice))


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
              # Booting at nice 5 beside the rest of the suite takes longer than alone.
              "DESKBOX_START_TIMEOUT_S": "1500"}
# A second server, whose warm pool keeps one VM ready (test_vm_warm_pool.py).
POOL_ENV = {"DESKBOX_BACKENDS": "vm", "DESKBOX_DEFAULT_BACKEND": "vm", "DESKBOX_POOL_SIZE": "1",
            "DESKBOX_DESKTOP_CALL_TIMEOUT_S": "60", "DESKBOX_START_TIMEOUT_S": "1500"}
PEER_INDEX = 1  # the package's peer network: its own, beside tests/isolation's
EARLY_NICE = 5


@dataclass
class PoolServer:
    process: subprocess.Popen[bytes]
    client: httpx.Client
    state_dir: Path


class EarlyVms:
    """The package's servers and their three VMs, started when collection ends."""

    def __init__(self) -> None:
        # The server's log stays (for a failure's story); the sessions' state goes.
        base = Path(tempfile.mkdtemp(prefix="deskbox-vm-tests-"))
        self.stack = contextlib.ExitStack()
        self.stack.callback(shutil.rmtree, base / "state", ignore_errors=True)
        self.vm = Vm(base / "state", base / "server.log", self.stack)
        self.stack.callback(lambda: reap(self.vm.orphans))
        self.started: dict[str, str] = {}
        self.stack.callback(shutil.rmtree, base / "pool-state", ignore_errors=True)
        try:
            self.pool = PoolServer(*self.stack.enter_context(serve(
                base / "pool-state", base / "pool-server.log", POOL_ENV, timeout_s=300.0,
                nice=EARLY_NICE)), base / "pool-state")
            self._start()
        except BaseException:
            self.stack.close()
            raise

    def _start(self) -> None:
        self.vm.start_server(nice=EARLY_NICE)
        _, allowed, _ = peer_addresses(PEER_INDEX)
        bodies = {
            "session": {"display": {"width": 1280, "height": 800},
                        "browser": {"start_url": events_data_url()}},
            "allowlisted": {"network": {"egress": "allowlist", "allow": [allowed]}},
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

    def renice(self, value: int) -> None:
        for process in (self.vm.process, self.pool.process):
            assert process is not None
            renice(process.pid, value)

    def close(self) -> None:
        self.stack.close()


_EARLY = pytest.StashKey["EarlyVms | str"]()  # or why they did not start


def pytest_collection_finish(session: pytest.Session) -> None:
    here = Path(__file__).parent
    if any(Path(str(item.fspath)).parent == here for item in session.items):
        vm_guest()
        try:
            session.config.stash[_EARLY] = EarlyVms()
        except Exception as error:  # noqa: BLE001 (the package's tests fail with it, not the run)
            session.config.stash[_EARLY] = f"the VM tests' server did not start: {error!r}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """If no test of the package ran (the run stopped first), the early VMs end here."""
    early = session.config.stash.get(_EARLY, None)
    if isinstance(early, EarlyVms):
        early.close()


@pytest.fixture(scope="package")
def peer() -> Iterator[Peer]:
    with peer_network(PEER_INDEX) as made:
        yield made


@pytest.fixture(scope="package")
def host_services() -> Iterator[HostServices]:
    with host_services_listening() as services:
        yield services


@pytest.fixture(scope="package")
def vm(request: pytest.FixtureRequest) -> Iterator[Vm]:
    early = request.config.stash[_EARLY]
    if isinstance(early, str):
        pytest.fail(early)
    early.renice(0)  # the rest of the suite is done: full speed
    with contextlib.closing(early):
        for name, session_id in early.started.items():
            setattr(early.vm, name, running(early.vm.client, session_id))
        yield early.vm


@pytest.fixture(scope="package")
def pool_server(vm: Vm, request: pytest.FixtureRequest) -> PoolServer:
    early = request.config.stash[_EARLY]
    assert isinstance(early, EarlyVms)
    return early.pool


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
