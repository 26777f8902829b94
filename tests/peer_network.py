"""A world beyond the host for egress tests, on this machine only.

``peer_network()`` makes a network namespace (``peer``) with a veth pair from the host and
two HTTP services on two addresses of a 10.x subnet; ``host_services_listening()`` listens
on the host's loopback and on every host address, as the control plane could. ``PROBE`` runs
inside a sandbox and reports what each connection did.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from deskbox_server.engines.network import HostAddresses

__all__ = ["PROBE", "SERVER", "HostServices", "Peer", "host_services_listening", "host_targets",
           "peer_addresses", "peer_network"]

# One HTTP/1.0 service per address given, all on one port; prints that port when listening.
SERVER = r"""
import socket, sys, threading
port = 0
def answer(c):
    with c:
        c.settimeout(10)
        try:
            c.recv(4096)
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
def serve(s):
    while True:
        threading.Thread(target=answer, args=(s.accept()[0],), daemon=True).start()
for address in sys.argv[1:]:
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    s.bind((address, port))
    s.listen()
    port = s.getsockname()[1]
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print(port, flush=True)
sys.stdin.read()
"""

# Run inside a sandbox: connect to each target, report what happened and how fast.
PROBE = r"""
import json, socket, sys, time
out = {}
for target in json.loads(sys.argv[1]):
    host, port = target.rsplit(":", 1)
    start = time.monotonic()
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as c:
            c.sendall(b"GET / HTTP/1.0\r\n\r\n")
            c.settimeout(5)
            out[target] = ["ok", c.recv(4096).decode(errors="replace")[-2:]]
    except OSError as e:
        out[target] = [type(e).__name__, e.errno]
    out[target].append(round(time.monotonic() - start, 3))
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Peer:
    """Two services beyond the host, on this machine: ``allowed`` and ``other``."""

    host_side: str  # the host's own address on the veth: a host address, never reachable
    allowed: str
    other: str
    port: int
    namespace: str  # the peer's network namespace, for programs a test runs there


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)


def _subnet(index: int) -> str:
    return f"10.{213 + index}.{20 + os.getpid() % 200}"


def peer_addresses(index: int = 0) -> tuple[str, str, str]:
    """The host side, ``allowed`` and ``other`` of ``peer_network(index)``, known before it
    exists (an allowlist of addresses can be given to a session ahead of it)."""
    subnet = _subnet(index)
    return f"{subnet}.1", f"{subnet}.2", f"{subnet}.3"


@contextmanager
def peer_network(index: int = 0) -> Iterator[Peer]:
    """The peer namespace, its veth and services; removed at the end. Each ``index`` is a
    network of its own (its own names and subnet): several can exist at once."""
    tag = os.getpid() % 100_000
    subnet = _subnet(index)
    name = f"dbxt-peer{index or ''}-{tag}"
    host_if, peer_if = f"dbxh{index or ''}{tag}", f"dbxp{index or ''}{tag}"
    _ip("netns", "add", name)
    server: subprocess.Popen[str] | None = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if, "netns", name)
        _ip("address", "add", f"{subnet}.1/24", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for last in (2, 3):
            _ip("-n", name, "address", "add", f"{subnet}.{last}/24", "dev", peer_if)
        _ip("-n", name, "link", "set", peer_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", SERVER,
             f"{subnet}.2", f"{subnet}.3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield Peer(*peer_addresses(index), port, name)
    finally:
        if server is not None:
            with server:
                server.kill()
        if Path(f"/sys/class/net/{host_if}").exists():
            _ip("link", "delete", host_if)  # and its peer
        _ip("netns", "delete", name)


@dataclass(frozen=True)
class HostServices:
    loopback_port: int  # like the control plane: 127.0.0.1
    any_port: int  # bound to every host address


@contextmanager
def host_services_listening() -> Iterator[HostServices]:
    with socket.socket() as loopback, socket.socket() as anywhere:
        loopback.bind(("127.0.0.1", 0))
        loopback.listen()
        anywhere.bind(("0.0.0.0", 0))
        anywhere.listen()
        yield HostServices(loopback.getsockname()[1], anywhere.getsockname()[1])


def host_targets(services: HostServices, peer: Peer) -> list[str]:
    """Every way to the host's own services: loopback, each host address (incl. the veth)."""
    targets = [f"127.0.0.1:{services.loopback_port}", f"127.0.0.1:{services.any_port}",
               f"[::1]:{services.any_port}", f"{peer.host_side}:{services.any_port}"]
    for address in HostAddresses.read().local:
        if address.startswith(("127.", "::1", "fe80:")):
            continue
        host = f"[{address}]" if ":" in address else address
        targets.append(f"{host}:{services.any_port}")
    return targets
