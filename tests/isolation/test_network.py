"""Egress ``none``, ``all`` and ``allowlist`` from inside real sandboxes.

Nothing here leaves this machine. The "outside world" is a network namespace the tests make
(``peer``): a veth pair from the host into it, with two HTTP services on two addresses of a
10.x subnet. ``all`` reaches both, ``allowlist`` only the one allowed (by a name the test
maps itself, never a public name), ``none`` neither. In every mode a service on the host's
loopback (where the control plane listens) and one on every host address are unreachable.
No sandbox here runs a browser, which would talk to the internet on its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from deskbox_server.engines.base import SessionSpec
from deskbox_server.engines.desktop_commands import DesktopSpec
from deskbox_server.engines.host_addresses import HostAddressWatch
from deskbox_server.engines.network import (
    NETNS_DIR,
    TABLE,
    Egress,
    HostAddresses,
    namespaces,
    resolve_egress,
)
from deskbox_server.engines.runc.engine import RuncEngine
from deskbox_server.engines.runc.sandbox import (
    RuncOptions,
    RuncSandbox,
    remove_orphans,
)
from deskbox_server.errors import SessionFailed
from deskbox_server.schemas.sessions import Network
from deskbox_server.sessions.desktop import Desktop

from ..peer_network import (
    PROBE,
    SERVER,
    HostServices,
    Peer,
    host_services_listening,
    host_targets,
    peer_network,
)
from .conftest import exec_in

# Run inside a sandbox: ask nf_tables (netlink) to delete our table; prints the kernel's errno.
_DELETE_TABLE = r"""
import socket, struct, sys
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)  # NETLINK_NETFILTER
s.bind((0, 0))
def msg(kind, flags, seq, family, res_id, payload=b""):
    body = struct.pack("=BBH", family, 0, socket.htons(res_id)) + payload
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body
name = sys.argv[1].encode() + b"\0"
attr = struct.pack("=HH", 4 + len(name), 1) + name + b"\0" * (-len(name) % 4)
# batch begin, NFT_MSG_DELTABLE (inet) with an ack, batch end
s.send(msg(0x10, 1, 1, 0, 10) + msg((10 << 8) | 2, 1 | 4, 2, 1, 0, attr) + msg(0x11, 1, 3, 0, 10))
reply = s.recv(65536)
print(struct.unpack("=i", reply[16:20])[0])
"""


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    with peer_network() as made:
        yield made


@pytest.fixture(scope="module")
def host_services() -> Iterator[HostServices]:
    with host_services_listening() as services:
        yield services


def _start(options: RuncOptions, tag: str, egress: Egress) -> RuncSandbox:
    return RuncSandbox.start(
        options, f"t-net-{tag}-{os.getpid()}", browser=False, timeout_s=30, network=egress
    )


@pytest.fixture(scope="module")
def host_watch(options: RuncOptions) -> Iterator[HostAddressWatch]:
    """What the engine runs beside its sessions (and what keeps an address another test
    gives the host meanwhile, a peer network of its own, blocked here too)."""
    watch = HostAddressWatch(options.id_prefix + "t-net-")  # _start's, not the engine test's
    watch.start()
    try:
        yield watch
    finally:
        watch.close()


@pytest.fixture(scope="module")
def sandboxes(
    options: RuncOptions, peer: Peer, host_watch: HostAddressWatch
) -> Iterator[dict[str, RuncSandbox]]:
    """One sandbox per mode; the allowlist allows ``peer.test``, which maps to ``allowed``."""
    allowlist = resolve_egress(
        "allowlist", ["peer.test"], resolver=lambda name: [peer.allowed] if name == "peer.test"
        else []
    )
    boxes: dict[str, RuncSandbox] = {}
    try:
        for mode, egress in (("none", Egress()), ("all", Egress("all")),
                             ("allowlist", allowlist)):
            boxes[mode] = _start(options, mode, egress)
        yield boxes
    finally:
        failures = []
        for box in boxes.values():
            try:
                box.destroy()
            except SessionFailed as error:
                failures.append(error)
        assert not failures


def _probe(sandbox: RuncSandbox, *targets: str) -> dict[str, list[object]]:
    done = exec_in(sandbox, "python3", "-c", PROBE, json.dumps(targets))
    assert done.returncode == 0, done.stderr
    result: dict[str, list[object]] = json.loads(done.stdout)
    return result


def test_all_reaches_services_beyond_the_host(
    sandboxes: dict[str, RuncSandbox], peer: Peer
) -> None:
    box = sandboxes["all"]
    result = _probe(box, f"{peer.allowed}:{peer.port}", f"{peer.other}:{peer.port}")
    assert [r[:2] for r in result.values()] == [["ok", "ok"], ["ok", "ok"]], result
    assert exec_in(box, "cat", "/etc/resolv.conf").stdout.startswith("nameserver 169.254.1.1")
    # Figures: namespace + rules + pasta up, and the whole start without a browser.
    print(f"network setup {box.timings['network'] * 1000:.0f} ms, "
          f"runc {box.timings['runc'] * 1000:.0f} ms")
    assert box.timings["network"] < 2.0


@contextmanager
def host_address(address: str) -> Iterator[None]:
    """``address`` on a new interface of the host's (a veth pair: this kernel has no dummy
    interfaces), up."""
    link, peer_link = f"dbxa{os.getpid() % 100000}", f"dbxb{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", peer_link],
                   check=True)
    try:
        subprocess.run(["ip", "address", "add", f"{address}/32", "dev", link], check=True)
        for name in (link, peer_link):
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        yield
    finally:
        subprocess.run(["ip", "link", "delete", link], check=False)


def wait_blocked(sandbox: RuncSandbox, address: str) -> None:
    """Until ``address`` is in the blocked set of the sandbox's rules (5 s at most)."""
    namespace = NETNS_DIR / sandbox.container_id
    deadline = time.monotonic() + 5
    while address not in subprocess.run(
        ["nsenter", f"--net={namespace}", "nft", "list", "set", "inet", TABLE, "blocked4"],
        capture_output=True, text=True, check=True,
    ).stdout:
        assert time.monotonic() < deadline, f"{address} was not blocked in {sandbox.label}"
        time.sleep(0.05)


def test_an_address_the_host_gains_later_is_unreachable_too(
    sandboxes: dict[str, RuncSandbox], host_services: HostServices
) -> None:
    """A bridge, a VPN or a container's veth that comes up after the sessions started: the
    host's services on every address listen there too, and pasta connects as the host."""
    address = f"10.214.{os.getpid() % 250}.1"
    target = f"{address}:{host_services.any_port}"
    with host_address(address):
        for mode in ("all", "allowlist"):
            wait_blocked(sandboxes[mode], address)
            outcome = _probe(sandboxes[mode], target)[target]
            assert outcome[0] == "ConnectionRefusedError", (mode, outcome)  # a reset, at once
            assert isinstance(outcome[2], float) and outcome[2] < 1.0, (mode, outcome)


def test_an_address_the_host_gains_back_is_blocked_for_sessions_started_meanwhile(
    options: RuncOptions, sandboxes: dict[str, RuncSandbox], host_services: HostServices
) -> None:
    """A bridge taken down and brought up again (``docker compose down``/``up``, a VPN): a
    session started while it was down has no rule for its address, and the watch took the
    address for one it knew, so the session reached the host's services on it."""
    address = f"10.215.{os.getpid() % 250}.1"
    with host_address(address):
        wait_blocked(sandboxes["all"], address)  # the watch has seen it
    time.sleep(0.5)  # and seen it go
    late = _start(options, "late", Egress("all"))
    try:
        with host_address(address):
            wait_blocked(late, address)
            target = f"{address}:{host_services.any_port}"
            assert _probe(late, target)[target][0] == "ConnectionRefusedError"
    finally:
        late.destroy()


def test_allowlist_reaches_only_the_allowed_service(
    sandboxes: dict[str, RuncSandbox], peer: Peer
) -> None:
    box = sandboxes["allowlist"]
    result = _probe(box, f"peer.test:{peer.port}", f"{peer.other}:{peer.port}")
    assert result[f"peer.test:{peer.port}"][:2] == ["ok", "ok"], result
    refused = result[f"{peer.other}:{peer.port}"]
    assert refused[0] == "ConnectionRefusedError", result  # a TCP reset: fails fast
    assert isinstance(refused[2], float) and refused[2] < 1.0
    # Names are what the host resolved at create time; nothing else resolves (and no
    # query leaves the sandbox: it has no nameserver).
    lookup = exec_in(box, "python3", "-c",
                     "import socket; print(socket.gethostbyname('peer.test'))\n"
                     "try: socket.gethostbyname('other.test')\n"
                     "except OSError as e: print(type(e).__name__)")
    assert lookup.stdout.split() == [peer.allowed, "gaierror"], lookup


# Run in the peer's namespace: a UDP service on ``allowed`` answers the sandbox's datagram;
# then ``other``, which the sandbox never wrote to, writes to the same host port (pasta's).
# Prints the service's port, then what ``other`` heard back.
_PEER_UDP = r"""
import json, socket, sys
allowed, other = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
allowed.bind((sys.argv[1], 0))
other.bind((sys.argv[2], 0))
print(allowed.getsockname()[1], flush=True)
allowed.settimeout(20)
data, knocker = allowed.recvfrom(2048)  # the sandbox's datagram, from pasta's host port
allowed.sendto(b"echo", knocker)
other.sendto(b"intruder", knocker)
other.settimeout(3)
heard = []
try:
    while True:
        heard.append(other.recvfrom(2048)[0].decode())
except TimeoutError:
    pass
print(json.dumps(heard), flush=True)
"""

# Run in a sandbox: one datagram to the service; answer whatever arrives; print what did.
_SANDBOX_UDP = r"""
import json, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"knock", (sys.argv[1], int(sys.argv[2])))
s.settimeout(2)
heard = []
try:
    while True:
        data, source = s.recvfrom(2048)
        heard.append([source[0], data.decode()])
        try:
            s.sendto(b"answer", source)
        except OSError:
            pass  # refused by the rules
except TimeoutError:
    pass
print(json.dumps(heard))
"""


@pytest.mark.parametrize("mode", ["all", "allowlist"])
def test_datagrams_from_elsewhere_do_not_reach_the_sandbox(
    sandboxes: dict[str, RuncSandbox], peer: Peer, mode: str
) -> None:
    """pasta relays to the sandbox every datagram sent to a UDP port it opened on the host
    for the sandbox, from whoever sent it. An allowlisted sandbox then talked both ways
    with an address outside its list (its answer counted as an established flow), and any
    sandbox was reachable from outside at that port, though no port is forwarded in."""
    service = subprocess.Popen(
        ["ip", "netns", "exec", peer.namespace, "python3", "-c", _PEER_UDP, peer.allowed,
         peer.other],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
    )
    with service:
        assert service.stdout is not None
        port = service.stdout.readline().strip()
        done = exec_in(sandboxes[mode], "python3", "-c", _SANDBOX_UDP, peer.allowed, port)
        other_heard = json.loads(service.stdout.readline() or "null")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[peer.allowed, "echo"]], (mode, done.stdout)
    assert other_heard == [], (mode, other_heard)


# Metadata services of clouds at addresses that are not link-local: Alibaba Cloud's ECS
# metadata, Azure's WireServer (extension settings and certificates; the Azure agent lets
# only the host's root reach it, and pasta connects as root), and the IPv6 endpoints of
# AWS's instance metadata and EKS Pod Identity.
_CLOUD_SERVICES = ("100.100.100.200", "168.63.129.16", "fd00:ec2::254", "fd00:ec2::23")


@pytest.fixture(scope="module")
def cloud_services() -> Iterator[int]:
    """HTTP services at ``_CLOUD_SERVICES``, in a namespace behind a veth of the host's
    whose routes send those addresses there (never to the machine's real gateway); their
    port."""
    tag = os.getpid() % 100_000
    name, host_if, far_if = f"dbxt-cloud-{tag}", f"dbxc{tag}", f"dbxd{tag}"
    subnet4, subnet6 = f"10.217.{os.getpid() % 250}", f"fd17:{tag:x}::"

    def ip(*argv: str) -> None:
        subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)

    ip("netns", "add", name)
    server: subprocess.Popen[str] | None = None
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", far_if, "netns", name)
        ip("address", "add", f"{subnet4}.1/24", "dev", host_if)
        ip("address", "add", f"{subnet6}1/64", "dev", host_if, "nodad")
        ip("link", "set", host_if, "up")
        ip("-n", name, "address", "add", f"{subnet4}.2/24", "dev", far_if)
        ip("-n", name, "address", "add", f"{subnet6}2/64", "dev", far_if, "nodad")
        for address in _CLOUD_SERVICES:
            prefix = "/128" if ":" in address else "/32"
            ip("-n", name, "address", "add", address + prefix, "dev", far_if, "nodad")
            ip("route", "add", address + prefix, "via",
               f"{subnet6}2" if ":" in address else f"{subnet4}.2")
        for link in (far_if, "lo"):
            ip("-n", name, "link", "set", link, "up")
        ip("-n", name, "route", "add", "default", "via", f"{subnet4}.1")
        ip("-n", name, "-6", "route", "add", "default", "via", f"{subnet6}1")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, "python3", "-c", SERVER, *_CLOUD_SERVICES],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        if server is not None:
            with server:
                server.kill()
        subprocess.run(["ip", "link", "delete", host_if], check=False)  # and its routes
        ip("netns", "delete", name)


@pytest.mark.parametrize("mode", ["all", "allowlist"])
def test_cloud_metadata_services_beyond_link_local_are_unreachable(
    sandboxes: dict[str, RuncSandbox], cloud_services: int, mode: str
) -> None:
    targets = [f"[{a}]:{cloud_services}" if ":" in a else f"{a}:{cloud_services}"
               for a in _CLOUD_SERVICES]
    for target, outcome in _probe(sandboxes[mode], *targets).items():
        assert outcome[0] == "ConnectionRefusedError", (mode, target, outcome)


@pytest.mark.parametrize("mode", ["none", "all", "allowlist"])
def test_the_host_and_its_loopback_are_unreachable(
    sandboxes: dict[str, RuncSandbox], peer: Peer, host_services: HostServices,
    mode: str,
) -> None:
    box = sandboxes[mode]
    result = _probe(box, *host_targets(host_services, peer))
    for target, outcome in result.items():
        assert outcome[0] != "ok", (target, outcome)
        assert isinstance(outcome[2], float) and outcome[2] < 1.0, (target, outcome)
    if mode == "none":
        assert exec_in(box, "ls", "/sys/class/net").stdout.split() == ["lo"]
        beyond = _probe(box, f"{peer.allowed}:{peer.port}")
        assert beyond[f"{peer.allowed}:{peer.port}"][0] != "ok"


@pytest.mark.parametrize("mode", ["all", "allowlist"])
def test_gateways_and_host_addresses_are_in_the_blocked_sets(
    sandboxes: dict[str, RuncSandbox], mode: str, peer: Peer
) -> None:
    """The gateway is never contacted by a test (it is outside this machine): read the rules."""
    network = sandboxes[mode].network
    assert network is not None
    rules = network.list_rules()
    host = HostAddresses.read()
    for address in (*host.gateways, peer.host_side):
        assert address in rules, address
    assert "--no-map-gw" in Path(f"/proc/{network.pasta_pid}/cmdline").read_text()


@pytest.mark.parametrize("mode", ["all", "allowlist"])
def test_the_sandbox_cannot_change_its_rules(
    sandboxes: dict[str, RuncSandbox], mode: str
) -> None:
    box = sandboxes[mode]
    assert box.network is not None and box.init_pid is not None
    before = box.network.list_rules()
    status = exec_in(box, "cat", "/proc/self/status").stdout
    eff = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    assert int(eff.split()[1], 16) & (1 << 12) == 0  # no CAP_NET_ADMIN
    done = exec_in(box, "python3", "-c", _DELETE_TABLE, TABLE)
    assert done.stdout.split() == ["-1"], (done.stdout, done.stderr)  # -EPERM
    assert box.network.list_rules() == before


def test_the_sandbox_joins_the_host_made_namespace(
    sandboxes: dict[str, RuncSandbox],
) -> None:
    for mode in ("all", "allowlist"):
        box = sandboxes[mode]
        assert box.network is not None and box.init_pid is not None
        assert os.stat(f"/proc/{box.init_pid}/ns/net").st_ino == os.stat(box.network.path).st_ino
    none = sandboxes["none"]
    assert none.network is None and not (NETNS_DIR / none.container_id).exists()


def test_another_session_is_unreachable(
    options: RuncOptions, sandboxes: dict[str, RuncSandbox]
) -> None:
    """A service inside one ``all`` session, probed from another at every address it has."""
    listener = subprocess.Popen(
        [*options.runc.command(), "exec", sandboxes["all"].container_id, "python3", "-c",
         SERVER, "0.0.0.0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        # pasta gives each namespace the host's addresses: the listener's are those.
        # (No name lookups here: in an ``all`` sandbox they would go to the real resolver.)
        targets = [f"{a}:{port}" for a in {*HostAddresses.read().local, "127.0.0.1"}
                   if "." in a]
        for mode in ("none", "allowlist"):
            for target, outcome in _probe(sandboxes[mode], *targets).items():
                assert outcome[0] != "ok", (mode, target, outcome)
    finally:
        # End it from inside (stdin closes): a killed ``runc exec`` would leave the server
        # as our zombie, and the sandbox's init waits for it before it can exit.
        with listener:
            pass


def _pasta_pids(sandbox: str = "") -> set[int]:
    """The host's pasta processes; with ``sandbox``, those of network namespaces whose name
    has it (other tests' sandboxes may have theirs meanwhile: make test runs two workers)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"pasta\0") and sandbox.encode() in cmdline:
                found.add(int(entry.name))
    return found


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def test_pasta_holds_only_cap_sys_admin_once_connected(
    sandboxes: dict[str, RuncSandbox],
) -> None:
    """What a reviewer checks of the process that parses every packet of the sandbox."""
    for mode in ("all", "allowlist"):
        network = sandboxes[mode].network
        assert network is not None and network.pasta_pid is not None
        pid = network.pasta_pid
        assert pid in _pasta_pids()
        status = dict(
            line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":\t" in line
        )
        caps = {name: int(status[name], 16) for name in
                ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
        assert caps["CapEff"] == caps["CapPrm"] == 1 << CAP_SYS_ADMIN, caps
        assert caps["CapBnd"] == (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN), caps
        assert caps["CapInh"] == caps["CapAmb"] == 0, caps
        # uid 0 of the host (it must join a namespace the host's root owns), but nothing
        # more can be gained: no_new_privs, and pasta's own seccomp filter.
        assert status["Uid"].split() == ["0"] * 4
        assert status["NoNewPrivs"].strip() == "1"
        assert status["Seccomp"].strip() == "2"
        # Detached from the host's filesystem and processes: an empty root of its own.
        for kind in ("mnt", "pid", "ipc", "uts"):
            assert os.readlink(f"/proc/{pid}/ns/{kind}") != os.readlink(f"/proc/self/ns/{kind}")
        assert os.listdir(f"/proc/{pid}/root") == []


def test_destroy_and_failed_starts_leave_nothing(
    options: RuncOptions, peer: Peer, tmp_path: Path
) -> None:
    box = _start(options, "gone", Egress("all"))
    assert box.network is not None
    pid, path = box.network.pasta_pid, box.network.path
    assert pid is not None and _pasta_pids(path.name) == {pid} and path.exists()
    started = time.monotonic()
    box.destroy()
    print(f"destroy with network {(time.monotonic() - started) * 1000:.0f} ms")
    assert not path.exists() and not _pasta_pids(path.name)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    # A start that fails after the network is up (runc cannot find the image).
    broken = RuncOptions(state_dir=tmp_path, rootfs=tmp_path / "missing", runc=options.runc)
    with pytest.raises(SessionFailed):
        _start(broken, "broken", Egress("all"))
    broken_netns = f"{broken.id_prefix}t-net-broken-{os.getpid()}"
    assert not _pasta_pids(broken_netns)
    assert not (NETNS_DIR / broken_netns).exists()


def test_remove_orphans_ends_pasta_and_the_namespace(
    options: RuncOptions, tmp_path: Path
) -> None:
    """A server that died left a sandbox with its network: the next one removes it all."""
    own = RuncOptions(
        state_dir=tmp_path, rootfs=options.rootfs, runc=options.runc, id_prefix="dbxorphan-"
    )
    box = _start(own, "orphan", Egress("allowlist"))
    assert box.network is not None and box.network.pasta_pid is not None
    pid, path = box.network.pasta_pid, box.network.path
    box.network.forget()  # what a dead server held is gone; the pid file stays
    assert remove_orphans(own) == [box.session_id]
    assert not path.exists() and pid not in _pasta_pids()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped
    assert namespaces(own.id_prefix) == []


def test_the_backend_creates_an_allowlisted_session_with_a_browser(
    options: RuncOptions, peer: Peer, host_services: HostServices
) -> None:
    """Through RuncEngine.create: the browser opens the allowed service's page, and an
    address the host gains meanwhile is refused (the engine watches the host's addresses).

    Safe with a browser: whatever else Chromium tries is refused inside the sandbox, and it
    has no DNS server to ask.
    """
    # A prefix of its own: the module's watch (host_watch) must not do the engine's work.
    options = dataclasses.replace(options, id_prefix="deskbox-engine-")
    backend = RuncEngine(options)
    allowed = f"http://{peer.allowed}:{peer.port}/"
    spec = SessionSpec(
        id=f"t-net-backend-{os.getpid()}", desktop=DesktopSpec(start_url=allowed),
        network=Network(egress="allowlist", allow=[peer.allowed]),
    )
    backend.check(spec)
    gained = f"10.214.{os.getpid() % 250}.2"

    async def scenario() -> dict[str, list[object]]:
        await backend.prepare()
        handle = await Desktop.start(backend, spec, 30.0)
        try:
            assert isinstance(handle.sandbox, RuncSandbox)
            with host_address(gained):
                # Refused all the same (an allowlist), but blocked: the set is what an
                # egress "all" session relies on.
                await asyncio.to_thread(wait_blocked, handle.sandbox, gained)
                return await asyncio.to_thread(
                    _probe, handle.sandbox, f"{peer.allowed}:{peer.port}",
                    f"{peer.other}:{peer.port}", f"{gained}:{host_services.any_port}",
                )
        finally:
            await handle.destroy()
            await backend.close()

    result = asyncio.run(scenario())
    assert [r[0] for r in result.values()] == ["ok"] + ["ConnectionRefusedError"] * 2, result
    assert not (NETNS_DIR / f"{options.id_prefix}{spec.id}").exists()
