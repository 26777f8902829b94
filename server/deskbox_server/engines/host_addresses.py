"""Addresses the host gains while sessions run are blocked in those sessions too.

A session with egress ``all`` or ``allowlist`` reaches the network through pasta, whose
connections are ordinary sockets of the host: an address of the host's own is one of the
host's services. Its rules (network.py) block the host's addresses as they are when it
starts; a network bridge, a VPN or a container's veth that comes up later would be open to
it. This watch listens for the kernel's address and route changes (rtnetlink) and adds what
is new to the blocked sets of every session network whose name has the engine's prefix.
Addresses the host loses stay blocked where they were (harmless); one it gains back counts
as new again: a session started while it was away has no rule for it.

One thread per engine, asleep until the kernel reports a change.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import threading

from ..errors import SessionFailed
from .network import NETNS_DIR, HostAddresses, block_addresses, namespaces

__all__ = ["HostAddressWatch", "start_host_watch"]

log = logging.getLogger("deskbox.engines")

# rtnetlink multicast groups (linux/rtnetlink.h): addresses and routes (gateways), v4 and v6.
_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV4_ROUTE = 0x40
_RTMGRP_IPV6_IFADDR = 0x100
_RTMGRP_IPV6_ROUTE = 0x400
_GROUPS = _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV4_ROUTE | _RTMGRP_IPV6_IFADDR | _RTMGRP_IPV6_ROUTE
# A change comes as a burst of messages (an interface's addresses and routes): they are
# read as one.
_BURST_S = 0.02


class HostAddressWatch:
    def __init__(self, prefix: str) -> None:
        """Watch for the namespaces ``/run/netns/<prefix>*``."""
        self._prefix = prefix
        self._known: set[str] = set()
        self._socket: socket.socket | None = None
        self._stop_read, self._stop_write = -1, -1
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read the host's addresses and start watching (blocking: a few milliseconds)."""
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK,
                             socket.NETLINK_ROUTE)
        sock.bind((0, _GROUPS))
        self._socket = sock
        # Read after subscribing: a change in between is then seen again, not missed.
        self._known = set(HostAddresses.read().blocked())
        self._stop_read, self._stop_write = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._watch, name="deskbox-host-addresses",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (blocking until the thread ends, at most a few seconds)."""
        if self._thread is not None:
            os.write(self._stop_write, b"x")
            self._thread.join(5.0)
            self._thread = None
        for fd in (self._stop_read, self._stop_write):
            if fd >= 0:
                os.close(fd)
        self._stop_read = self._stop_write = -1
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _watch(self) -> None:
        assert self._socket is not None
        watched = [self._socket.fileno(), self._stop_read]
        while True:
            ready, _, _ = select.select(watched, [], [])
            if self._stop_read in ready:
                return
            self._drain()
            # The rest of the burst, then one look at what the host has now.
            ready, _, _ = select.select([self._stop_read], [], [], _BURST_S)
            if ready:
                return
            self._drain()
            try:
                self.apply()
            except Exception:  # a failing `ip` must not end the watch
                log.exception("blocking the host's new addresses in session networks")

    def _drain(self) -> None:
        assert self._socket is not None
        while True:
            try:
                self._socket.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno == errno.ENOBUFS:
                    continue  # messages were lost, which says "changed" too
                return

    def apply(self) -> set[str]:
        """Block, in every session network of the prefix, what the host has gained since
        the last look; what was gained."""
        now = set(HostAddresses.read().blocked())
        gained = now - self._known
        if not gained:
            self._known = now
            return gained
        for name in namespaces(self._prefix):
            block_addresses(NETNS_DIR / name, gained)
        self._known = now  # only once blocked: a failure is retried at the next change
        log.info("blocked the host's new addresses %s in session networks",
                 ", ".join(sorted(gained)))
        return gained


def start_host_watch(watch: HostAddressWatch) -> None:
    """Start ``watch``; where the kernel refuses its socket, serve on without it (sessions
    then block the host's addresses of their start only, as they always do) and say so."""
    try:
        watch.start()
    except (OSError, SessionFailed) as error:  # no netlink socket, or `ip` failed
        watch.close()
        log.warning("not watching the host's addresses (%s): an address the host gains "
                    "later is not blocked for sessions started before", error)
