"""A session's network egress: ``none``, ``all`` or ``allowlist`` (API.md, create ``network``).

``none`` needs nothing from here: the sandbox gets a new, empty network namespace (loopback
only, oci.py). For ``all`` and ``allowlist`` the host makes, per session:

- a named network namespace, ``/run/netns/<name>`` (``ip netns add``), which a runc
  sandbox's ``config.json`` joins by path, and a VM's QEMU is started in (engines/vm/jail.py:
  the guest's NIC is QEMU's user network, so its connections are QEMU's sockets there);
- a pasta process connecting it to the host's network: it copies the host's addresses and
  routes into the namespace (``--config-net``) and turns the sandbox's connections into
  ordinary sockets of the host. With ``-t/-u/-T/-U none`` no port is forwarded either way
  (by default pasta binds the host's listening ports inside the namespace and forwards
  them to the host's loopback); with ``--no-map-gw`` the gateway's address is not the
  host. pasta daemonizes once the namespace is configured and quits when the namespace's
  file is removed. It runs as uid 0 of the host with CAP_SYS_ADMIN only (see
  :data:`PASTA_PRIVILEGES`), no_new_privs, its own seccomp filter, and its own mount, pid,
  ipc and uts namespaces with an empty root;
- an nftables table loaded *inside* that namespace from the host. The sandbox has no
  CAP_NET_ADMIN in the namespace's owning user namespace (the host's), so it can neither
  read nor change the rules. The output chain drops by default and rejects (TCP reset,
  ICMP admin-prohibited) so clients fail at once: always the host's own addresses (those
  it gains later too: host_addresses.py adds them), its gateways, loopback, link-local
  and multicast ranges, and the clouds' metadata services (also those outside
  link-local); for ``allowlist`` everything but the allowed
  addresses. The input chain drops what comes in unasked (pasta relays a datagram to the
  sandbox from anyone who writes to a UDP port it opened for it).

Host names of an allowlist are resolved on the host when the session is created; the
sandbox gets an ``/etc/hosts`` with those addresses and no DNS server, so it cannot look up
(or tunnel data through) other names. Limits, on purpose kept simple: a name's addresses
are those of create time (a CDN that moves the name elsewhere breaks it); every port and
protocol of an allowed address is open. For ``all`` the sandbox's resolver
is pasta's DNS forwarder (:data:`DNS_FORWARD`), which relays to the host's first resolver.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import Conflict, InvalidRequest, SessionFailed, Timeout
from ..schemas.sessions import is_host_name_or_ip
from .fd_wait import readable

__all__ = [
    "DNS_FORWARD",
    "NETNS_DIR",
    "PASTA_PRIVILEGES",
    "TABLE",
    "Egress",
    "HostAddresses",
    "SessionNetwork",
    "block_addresses",
    "bring_up_loopback",
    "check_allow",
    "hosts_file",
    "namespaces",
    "resolv_conf",
    "resolve_egress",
    "ruleset",
]

Mode = Literal["none", "all", "allowlist"]
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Sequence[str]]

NETNS_DIR = Path("/run/netns")
TABLE = "deskbox"
# Where the sandbox sends DNS queries with egress ``all``; pasta relays them to the host's
# resolver. Link-local, so it is never a real destination of the sandbox's traffic.
DNS_FORWARD = "169.254.1.1"
MAX_ALLOW = 256
# What pasta may ever hold. It parses every packet of the sandbox, so it gets only the two
# capabilities it needs: CAP_NET_ADMIN to open the tap device in the namespace and configure
# it at start, CAP_SYS_ADMIN to setns() into the namespace for as long as it runs (it opens
# its sockets there on demand). Debian 12's pasta then drops every capability but
# CAP_SYS_ADMIN and CAP_NET_BIND_SERVICE itself; without the second in its bounding set it
# keeps CAP_SYS_ADMIN alone. It stays uid 0: under any other uid pasta makes a user
# namespace of its own, from which it cannot join a namespace the host's root owns.
PASTA_PRIVILEGES = ("setpriv", "--bounding-set", "-all,+net_admin,+sys_admin",
                    "--inh-caps", "-all")
_RESOLVE_TIMEOUT_S = 10.0
# Clouds' services for the machine itself that are not link-local: Alibaba Cloud's instance
# metadata, Azure's WireServer (extension settings and certificates; the Azure agent lets
# only the host's root reach it, and pasta connects as root), and AWS's instance metadata
# and EKS Pod Identity over IPv6.
_CLOUD_SERVICES = (
    "100.100.100.200/32", "168.63.129.16/32", "fd00:ec2::254/128", "fd00:ec2::23/128",
)
# Never reachable from a sandbox, whatever the host's configuration.
_ALWAYS_BLOCKED = (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3",
    "::/127", "::ffff:0:0/96", "fe80::/10", "ff00::/8", *_CLOUD_SERVICES,
)


def _ip(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class Egress:
    """A session's egress with the allowlist already resolved: (entry, its addresses)."""

    mode: Mode = "none"
    allowed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def addresses(self) -> list[Address]:
        return [ipaddress.ip_address(ip) for _, ips in self.allowed for ip in ips]


def _system_resolver(name: str) -> list[str]:
    infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    return sorted({str(info[4][0]) for info in infos})


def check_allow(mode: str, allow: Sequence[str]) -> None:
    """InvalidRequest for an entry that is neither an IP address nor a host name, for
    ``allow`` without egress ``allowlist``, and for too many entries."""
    if allow and mode != "allowlist":
        raise InvalidRequest("network.allow needs network.egress 'allowlist'")
    if len(allow) > MAX_ALLOW:
        raise InvalidRequest(f"network.allow has more than {MAX_ALLOW} entries")
    for entry in allow:
        if not is_host_name_or_ip(entry):
            raise InvalidRequest(f"network.allow entry {entry!r} is not a host name or an IP")


def resolve_egress(
    mode: Mode,
    allow: Sequence[str] = (),
    resolver: Resolver = _system_resolver,
    timeout_s: float = _RESOLVE_TIMEOUT_S,
) -> Egress:
    """Check ``allow`` and resolve its host names (blocking; run it off the event loop).

    InvalidRequest as :func:`check_allow`, and for names that do not resolve.
    """
    check_allow(mode, allow)
    names = sorted({entry for entry in allow if _ip(entry) is None})
    resolved: dict[str, tuple[str, ...]] = {
        entry: (str(_ip(entry)),) for entry in allow if _ip(entry) is not None
    }
    if names:
        pool = ThreadPoolExecutor(max_workers=min(16, len(names)))
        try:
            futures = {name: pool.submit(resolver, name) for name in names}
            deadline = time.monotonic() + timeout_s
            for name, future in futures.items():
                try:
                    ips = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    raise Timeout(f"resolving the allowlist timed out at {name!r}") from None
                except OSError as error:
                    message = f"network.allow: cannot resolve {name!r}: {error}"
                    raise InvalidRequest(message) from None
                addresses = sorted({str(a) for a in map(_ip, ips) if a is not None})
                if not addresses:
                    raise InvalidRequest(f"network.allow: {name!r} has no address")
                resolved[name] = tuple(addresses)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    return Egress(mode, tuple(sorted(resolved.items())))


# -- what the sandbox sees ------------------------------------------------------------------


def hosts_file(egress: Egress, hostname: str = "deskbox") -> str:
    """``/etc/hosts``: localhost, the sandbox's own name (so looking it up asks no DNS
    server), and for an allowlist the allowed names."""
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{hostname}",
             "::1\tlocalhost ip6-localhost ip6-loopback"]
    for name, ips in egress.allowed:
        if _ip(name) is None:
            lines.extend(f"{ip}\t{name.rstrip('.')}" for ip in ips)
    return "\n".join(lines) + "\n"


def resolv_conf(egress: Egress) -> str:
    """``/etc/resolv.conf``: pasta's forwarder for ``all``, no server for ``allowlist``."""
    if egress.mode == "all":
        return f"nameserver {DNS_FORWARD}\noptions timeout:2 attempts:2\n"
    # No nameserver: glibc then asks 127.0.0.1, the sandbox's own loopback, and fails fast.
    return "options timeout:1 attempts:1\n"


# -- the host -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostAddresses:
    """The host's own addresses and its gateways, as the sandbox must never reach them."""

    local: tuple[str, ...]
    gateways: tuple[str, ...]

    @classmethod
    def read(cls) -> HostAddresses:
        links = json.loads(_run(["ip", "-j", "address", "show"]) or "[]")
        local = [info["local"] for link in links for info in link.get("addr_info", [])
                 if "local" in info]
        gateways: list[str] = []
        for family in ("-4", "-6"):
            routes = json.loads(_run(["ip", "-j", family, "route", "show", "default"]) or "[]")
            gateways.extend(route["gateway"] for route in routes if "gateway" in route)
        return cls(tuple(local), tuple(gateways))

    def blocked(self) -> tuple[str, ...]:
        """What a session's rules block of the host (besides the ranges always blocked)."""
        return (*self.local, *self.gateways)


def _collapse(networks: Iterable[Network], version: int) -> list[str]:
    """Merged, non-overlapping networks of one IP version (nft refuses overlaps)."""
    if version == 4:
        v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
        return [str(n) for n in ipaddress.collapse_addresses(v4)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    return [str(n) for n in ipaddress.collapse_addresses(v6)]


def _nets(texts: Iterable[str]) -> list[Network]:
    return [ipaddress.ip_network(text.split("%", 1)[0], strict=False) for text in texts]


def ruleset(egress: Egress, host: HostAddresses) -> str:
    """The nftables script loaded inside the session's namespace (replaces our table)."""
    blocked = _nets([*_ALWAYS_BLOCKED, *host.blocked()])
    allowed = [ipaddress.ip_network(a) for a in egress.addresses]

    def named_set(name: str, kind: str, elements: list[str]) -> str:
        # auto-merge: addresses the host gains later are added to the blocked sets as they
        # come (block_addresses), overlapping what is there already.
        body = f"type {kind}; flags interval; auto-merge;"
        if elements:
            body += f" elements = {{ {', '.join(elements)} }}"
        return f"  set {name} {{ {body} }}"

    sets = [
        named_set("blocked4", "ipv4_addr", _collapse(blocked, 4)),
        named_set("blocked6", "ipv6_addr", _collapse(blocked, 6)),
        named_set("allowed4", "ipv4_addr", _collapse(allowed, 4)),
        named_set("allowed6", "ipv6_addr", _collapse(allowed, 6)),
    ]
    output = [
        "oifname \"lo\" accept",
        "ct state established,related accept",
        # Neighbour discovery with pasta's side of the link (ARP is not seen by inet tables).
        "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept",
    ]
    if egress.mode == "all":
        output.append(f"ip daddr {DNS_FORWARD} meta l4proto {{ tcp, udp }} th dport 53 accept")
    output += ["ip daddr @blocked4 goto refuse", "ip6 daddr @blocked6 goto refuse"]
    if egress.mode == "all":
        output.append("accept")
    else:
        output += ["ip daddr @allowed4 accept", "ip6 daddr @allowed6 accept"]
    output.append("goto refuse")
    lines = [
        f"table inet {TABLE}", f"delete table inet {TABLE}", f"table inet {TABLE} {{", *sets,
        "  chain output {",
        "    type filter hook output priority filter; policy drop;",
        *(f"    {rule}" for rule in output),
        "  }",
        # pasta relays to the sandbox every datagram sent to a UDP port it opened on the
        # host for the sandbox, from whoever sent it: the input chain lets in only what
        # answers the sandbox's own traffic (and neighbour discovery, which conntrack does
        # not track). Else anyone could write to the sandbox, and its answer, an
        # established flow to the output chain, would reach an address it may not.
        "  chain input {",
        "    type filter hook input priority filter; policy accept;",
        "    iifname \"lo\" accept",
        "    ct state new drop",
        "  }",
        "  chain refuse {",
        "    meta l4proto tcp reject with tcp reset",
        "    reject with icmpx type admin-prohibited",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def block_addresses(namespace: Path, addresses: Iterable[str]) -> None:
    """Add ``addresses`` to the blocked sets of the rules in ``namespace`` (a session's
    named network namespace). Best effort: what it cannot add is blocked already (inside a
    blocked range), or its namespace is gone."""
    nets = _nets(addresses)
    script = "".join(
        f"add element inet {TABLE} blocked{version} {{ {', '.join(elements)} }}\n"
        for version in (4, 6) if (elements := _collapse(nets, version))
    )
    if not script:
        return
    try:
        _load_nft(namespace, script)
    except SessionFailed:
        # Rules a server before auto-merge made refuse an address inside a blocked range
        # (already blocked, then): each one alone, those are the ones that fail.
        for net in nets:
            with contextlib.suppress(SessionFailed):
                _load_nft(namespace, f"add element inet {TABLE} blocked{net.version} {{ {net} }}\n")


def _load_nft(namespace: Path, script: str) -> None:
    """Run the nftables ``script`` inside the named network namespace at ``namespace``."""
    _run(["nsenter", f"--net={namespace}", "nft", "-f", "-"], stdin=script)


def bring_up_loopback(pid: int) -> None:
    """Set ``lo`` up in the network namespace of ``pid`` (which gives it 127.0.0.1 and ::1).

    runc restores a sandbox's own network namespace empty (CRIU's ``--empty-ns network``,
    for runtimes whose network hooks configure it again), so after a restore its loopback is
    down and the browser's DevTools listener on 127.0.0.1 unreachable.
    """
    _run(["nsenter", "--target", str(pid), "--net", "ip", "link", "set", "lo", "up"])


def namespaces(prefix: str) -> list[str]:
    """Names of the host's named network namespaces that start with ``prefix``."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(entry.name for entry in NETNS_DIR.iterdir() if entry.name.startswith(prefix))


def _run(argv: list[str], stdin: str | None = None, timeout_s: float = 10.0) -> str:
    try:
        done = subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SessionFailed(f"{argv[0]} failed: {error}") from None
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["?"]
        raise SessionFailed(f"{' '.join(argv[:3])} failed: {message[0][:500]}")
    return done.stdout


# -- one session ----------------------------------------------------------------------------


class SessionNetwork:
    """The named namespace, pasta and rules of one session. :meth:`teardown` is idempotent.

    ``work_dir`` (host-only, mode 0700) keeps pasta's pid file, so a later server process can
    find and end it.
    """

    def __init__(self, name: str, work_dir: Path) -> None:
        self.name = name
        self.path = NETNS_DIR / name
        self.pid_file = work_dir / "pasta.pid"
        self.pasta_pid: int | None = None
        self._pidfd: int | None = None

    @classmethod
    def setup(
        cls, name: str, egress: Egress, work_dir: Path, host: HostAddresses | None = None
    ) -> SessionNetwork:
        """Create the namespace, start pasta, load the rules; cleans up after itself."""
        if egress.mode == "none":
            raise ValueError("egress 'none' needs no host-side network")
        network = cls(name, work_dir)
        try:
            network._setup(egress, host or HostAddresses.read())
        except BaseException:
            network.teardown()
            raise
        return network

    def _setup(self, egress: Egress, host: HostAddresses) -> None:
        if self.path.exists():
            raise Conflict(f"the network namespace {self.name} exists already")
        _run(["ip", "netns", "add", self.name])
        # Rules first: the namespace has no route out before pasta configures it.
        _load_nft(self.path, ruleset(egress, host))
        argv = [
            *PASTA_PRIVILEGES,
            "pasta", "--quiet", "--runas", "0", "--netns-only", "--netns", str(self.path),
            "--config-net", "--no-map-gw", "--no-dhcp", "--no-dhcpv6", "--no-ra",
            "-t", "none", "-u", "none", "-T", "none", "-U", "none", "-P", str(self.pid_file),
        ]
        if egress.mode == "all":
            argv += ["--dns-forward", DNS_FORWARD]
        # pasta forks into the background once the namespace is configured, then this exits.
        _run(argv, timeout_s=15.0)
        self._track(int(self.pid_file.read_text().strip()))
        # An address the host gained since it was read: the engine's HostAddressWatch
        # (host_addresses.py) may have looked at the namespaces before this one was made.
        if gained := set(HostAddresses.read().blocked()) - set(host.blocked()):
            block_addresses(self.path, gained)

    def list_rules(self) -> str:
        """The namespace's ruleset as nft prints it (for tests and diagnosis)."""
        return _run(["nsenter", f"--net={self.path}", "nft", "list", "ruleset"])

    def _track(self, pid: int) -> None:
        """Hold a pidfd of pasta ``pid`` if it is really this namespace's pasta."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        if str(self.path).encode() not in cmdline:  # a recycled pid: not ours
            os.close(pidfd)
            return
        self.pasta_pid, self._pidfd = pid, pidfd

    @classmethod
    def find(cls, name: str, work_dir: Path) -> SessionNetwork:
        """The network of a session a previous server process started (for teardown)."""
        network = cls(name, work_dir)
        with contextlib.suppress(OSError, ValueError):
            network._track(int(network.pid_file.read_text().strip()))
        return network

    def forget(self) -> None:
        """Drop our handle of pasta without ending it (it still runs; ``find`` finds it)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
        self._pidfd, self.pasta_pid = None, None

    def failure(self) -> str | None:
        if self._pidfd is not None and readable([self._pidfd]):
            return "the session's network relay (pasta) exited"
        return None

    def teardown(self) -> None:
        """End pasta (and reap it if it is our child), remove the namespace and its rules."""
        errors: list[str] = []
        if self._pidfd is not None:
            for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, sig)
                if readable([self._pidfd], wait_s):
                    break
            os.close(self._pidfd)
            self._pidfd = None
        if self.pasta_pid is not None:
            # Daemonized pasta is reparented to us if we are a subreaper.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pasta_pid, os.WNOHANG)
            self.pasta_pid = None
        if self.path.exists() or self.path.is_symlink():
            # Deleting the namespace also deletes its nftables state.
            try:
                _run(["ip", "netns", "delete", self.name])
            except SessionFailed as error:
                errors.append(str(error))
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()
        if errors:
            raise SessionFailed("; ".join(errors))
