"""``python3 -m deskbox_agent``: print the version, or serve on one listening address.

``--listen unix:PATH`` and ``tcp:HOST:PORT`` accept connections (each its own HTTP/2
connection); with ``--token-file`` a TCP connection is served only after its first line
proved the token (a pod's agent, reachable from its whole cluster network: PROTOCOL.md
"Transport"). ``serial:PATH`` opens a character device such as a virtio-serial port, serves
the one connection it carries once a host is there, and opens it again when the host goes
away.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hmac
import logging
import os
import select
import signal
import sys
import termios
import tty
from collections.abc import Mapping

from . import PROTOCOL, VERSION
from .desktop import register_desktop
from .desktop.session_init import ENV as INIT_DIR_ENV
from .execute import install_child_watcher
from .h2server import serve_connection
from .limits import Limits
from .registry import Json, Registry
from .routes import Router

__all__ = ["main"]

log = logging.getLogger("deskbox_agent")
SERIAL_RETRY_S = 0.2
SERIAL_POLL_S = 0.05  # how soon a new host's first bytes are served
TOKEN_PREFIX = b"DESKBOX-AGENT-TOKEN "
TOKEN_WAIT_S = 5.0  # for a connection's first line
MIN_TOKEN_CHARS = 32


def default_registry() -> Registry:
    """The calls every agent has; ``main`` adds the desktop's (desktop/service.py) when the
    agent has a display."""
    registry = Registry()

    async def echo(args: Mapping[str, Json]) -> Json:  # for tests and latency figures
        return dict(args)

    registry.register("echo", echo)
    return registry


def read_token(path: str) -> bytes:
    """The token a connection must prove: one line of at least MIN_TOKEN_CHARS printable
    ASCII characters."""
    try:
        with open(path, "rb") as file:
            token = file.read(4096).strip()
    except OSError as e:
        raise SystemExit(f"cannot read the token file {path}: {e.strerror}") from None
    if len(token) < MIN_TOKEN_CHARS or not all(0x21 <= c <= 0x7E for c in token):
        raise SystemExit(f"the token in {path} must be {MIN_TOKEN_CHARS} or more printable "
                         "ASCII characters")
    return token


async def _proved(reader: asyncio.StreamReader, token: bytes) -> bool:
    """Whether the connection's first line is ``DESKBOX-AGENT-TOKEN <token>``; nothing is
    answered before, so a peer without the token learns nothing but a closed connection."""
    try:
        async with asyncio.timeout(TOKEN_WAIT_S):
            line = await reader.readuntil(b"\n")
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        return False
    return hmac.compare_digest(line, TOKEN_PREFIX + token + b"\n")


async def serve(address: str, limits: Limits, registry: Registry,
                token: bytes | None = None) -> None:
    router = Router(registry, limits)
    scheme, _, rest = address.partition(":")
    if token is not None and scheme != "tcp":
        raise SystemExit("--token-file is for tcp: addresses")

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if token is not None and not await _proved(reader, token):
            peer = writer.get_extra_info("peername")
            log.warning("closed a connection from %s that did not prove the token", peer)
            writer.close()
            return
        await serve_connection(reader, writer, router, limits)

    if scheme == "unix":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rest)
        server = await asyncio.start_unix_server(on_connection, rest, limit=limits.read_chunk)
    elif scheme == "tcp":
        host, _, port = rest.rpartition(":")
        server = await asyncio.start_server(on_connection, host, int(port),
                                            limit=limits.read_chunk)
    elif scheme == "serial":
        await _serve_serial(rest, router, limits)
        return
    else:
        raise SystemExit(f"unknown listen address {address!r}: unix:, tcp: or serial:")
    print(f"deskbox-agent {VERSION} listening on {address}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def _same(protocol: asyncio.StreamReaderProtocol) -> asyncio.StreamReaderProtocol:
    return protocol


async def _serve_serial(path: str, router: Router, limits: Limits) -> None:
    """One connection at a time over a character device, reopened whenever it ends."""
    loop = asyncio.get_running_loop()
    announced = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            log.info("cannot open %s yet: %s", path, e)
            await asyncio.sleep(SERIAL_RETRY_S)
            continue
        if os.isatty(fd):
            tty.setraw(fd, termios.TCSANOW)  # bytes as they are: no echo, no line discipline
        if not announced:
            print(f"deskbox-agent {VERSION} serving {path}", file=sys.stderr, flush=True)
            announced = True
        await _wait_for_host(fd)
        reader = asyncio.StreamReader(limit=limits.read_chunk)
        read_file = os.fdopen(fd, "rb", buffering=0)
        write_file = os.fdopen(os.dup(fd), "wb", buffering=0)
        protocol = asyncio.StreamReaderProtocol(reader)
        read_transport, _ = await loop.connect_read_pipe(functools.partial(_same, protocol),
                                                         read_file)
        write_transport, write_protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, write_file
        )
        writer = asyncio.StreamWriter(write_transport, write_protocol, reader, loop)
        try:
            await serve_connection(reader, writer, router, limits)
        finally:
            read_transport.close()
            write_transport.close()
        await asyncio.sleep(SERIAL_RETRY_S)


async def _wait_for_host(fd: int) -> None:
    """Keep the port open until a host is on its other side.

    A virtio-serial port with no host reads as end of file (poll: POLLHUP). Closing it then
    and opening it again would discard whatever a host sends in between (the guest's
    kernel drops a closed port's buffered input), so the port stays open while it waits.
    It is closed only after a connection that a host made ended, which also tells the host
    (QEMU's VSERPORT_CHANGE) that its last stream is over.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        events = poller.poll(0)
        if not events or not events[0][1] & select.POLLHUP:
            return
        await asyncio.sleep(SERIAL_POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="deskbox-agent")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--listen", metavar="ADDRESS",
                        help="unix:PATH, tcp:HOST:PORT or serial:PATH")
    parser.add_argument("--token-file", metavar="PATH",
                        help="serve a tcp: connection only after it sent this file's token")
    parser.add_argument("--display", metavar=":N",
                        help="the X display to drive (default: $DISPLAY; none: no desktop calls)")
    parser.add_argument("--patience", type=float, default=1.0, metavar="FACTOR",
                        help="multiply the waits on other clients (a slow, emulated guest)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.version:
        print(f"deskbox-agent {VERSION} protocol {PROTOCOL}")
        return 0
    if not args.listen:
        parser.error("--listen is required (or --version)")
    if not 1.0 <= args.patience <= 100.0:
        parser.error("--patience is a factor from 1 to 100")
    token = read_token(args.token_file) if args.token_file else None
    # Out of the environment: the commands the agent runs see no DESKBOX_ variable.
    init_dir = os.environ.pop(INIT_DIR_ENV, "") or None
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="deskbox-agent: %(message)s")

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        install_child_watcher()
        registry = default_registry()
        display = args.display or os.environ.get("DISPLAY") or None
        service = (register_desktop(registry, display, args.patience, init_dir)
                   if display else None)
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await serve(args.listen, Limits(), registry, token)
        finally:
            if service is not None:
                await asyncio.to_thread(service.close)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
