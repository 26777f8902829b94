"""``deskbox serve``: logging set up for who reads it, uvicorn, and a start banner.

The banner comes once the socket listens (not before the image build, which can take
minutes): the URL, where the API key is, and a ``curl`` that works as printed. It never
holds a key: the curl reads the key file, or ``$DESKBOX_API_KEY`` when the keys come from
``DESKBOX_API_KEYS``. On a terminal it is plain lines (easy to copy); as JSON lines it is
one record with the same facts as fields.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import resource
import shlex
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .app import create_app
from .errors import DeskboxError, InvalidSetting
from .http_protocol import DeskboxWebSocket, deskbox_http_protocol
from .logs import LogFormat, configure_logging
from .metrics import Metrics
from .settings import Settings

__all__ = ["Banner", "banner", "bind", "protocol_options", "raise_open_files_limit", "run"]

log = logging.getLogger("deskbox.serve")

# uvicorn's exit code when the server could not start (uvicorn.run's, kept).
_STARTUP_FAILURE = 3


@dataclass(frozen=True)
class Banner:
    url: str
    key_file: Path | None  # None: the keys come from DESKBOX_API_KEYS
    curl: str

    def lines(self) -> list[str]:
        where = (
            f"API key: in {self.key_file} (send it as 'Authorization: Bearer <key>')"
            if self.key_file is not None
            else "API keys: from DESKBOX_API_KEYS (export one as DESKBOX_API_KEY for the curl)"
        )
        return [f"Deskbox serves {self.url}", where, f"Try it: {self.curl}"]


def _client_host(host: str) -> str:
    """The address a local client dials for ``host`` (a wildcard means every address)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host or "127.0.0.1"  # a name
    if address.is_unspecified:
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    return f"[{address}]" if address.version == 6 else str(address)


def banner(host: str, port: int, key_file: Path | None) -> Banner:
    url = f"http://{_client_host(host)}:{port}"
    key = (
        f"$(cat {shlex.quote(str(key_file.resolve()))})" if key_file is not None
        else "$DESKBOX_API_KEY"
    )
    curl = f'curl -H "Authorization: Bearer {key}" {url}/v1/sessions'
    return Banner(url, key_file.resolve() if key_file is not None else None, curl)


class _Server(uvicorn.Server):
    """uvicorn that announces itself once it listens, and stops every session however
    often it is told to stop."""

    def __init__(
        self, config: uvicorn.Config, key_file: Path | None, log_format: str,
        stopping: Callable[[], None],
    ) -> None:
        super().__init__(config)
        self.key_file = key_file
        self.log_format = log_format
        self.stopping = stopping  # told first, while requests still run

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started or self.should_exit:
            return
        # What start-up made (modules, the app, pydantic's schemas: ~130,000 objects) lives
        # as long as the process, and each full collection of the cyclic GC walked all of
        # it: 60-75 ms here, every session's actions waiting, several times a second while
        # a client paged through sessions. Frozen, a full collection takes ~2 ms.
        gc.collect()
        gc.freeze()
        listening: socket.socket = self.servers[0].sockets[0]
        port = int(listening.getsockname()[1])  # the real one when asked for port 0
        shown = banner(self.config.host, port, self.key_file)
        if self.log_format == "text":
            # Plain lines between blank ones: the curl copies as it is.
            print("", *shown.lines(), "", sep="\n", file=sys.stderr, flush=True)
        else:
            keys = ({"api_key_file": str(shown.key_file)} if shown.key_file is not None
                    else {"api_keys": "DESKBOX_API_KEYS"})
            log.info("serving %s", shown.url, extra={"url": shown.url, **keys, "curl": shown.curl})

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.stopping()
        await super().shutdown(sockets)
        # A second Ctrl-C (uvicorn's force_exit) makes uvicorn skip the app's shutdown, and
        # every session's sandbox would outlive the server. The force still cuts short the
        # wait for open connections; the sessions are stopped all the same.
        done = getattr(self.lifespan, "shutdown_event", None)
        if self.force_exit and isinstance(done, asyncio.Event) and not done.is_set():
            await self.lifespan.shutdown()


def protocol_options(settings: Settings, metrics: Metrics | None = None) -> dict[str, Any]:
    """uvicorn's protocol options for this server (the test suite's servers use them too).

    HTTP/1.1 through h11 with a deadline on each request's head, and our error body for a
    request that is not HTTP or a websocket handshake that fails (http_protocol.py); a
    connection closed for its head is counted in ``metrics`` as a slow client.

    uvicorn closes (1009) any message over ``ws_max_size``, 16 MiB by default, before the
    app sees it: DevTools messages may be as large as ``cdp_max_message_bytes`` (64 MiB; a
    Playwright ``set_input_files`` of 15 MB disconnected the browser). Each endpoint then
    bounds its own (cdp.py; the actions websocket: ``max_request_bytes``)."""

    def head_overdue() -> None:
        if metrics is not None:
            metrics.slow_clients.inc("request_head")

    return {
        "http": deskbox_http_protocol(settings.request_head_timeout_s, head_overdue),
        "ws": DeskboxWebSocket,  # websockets-sansio, with our error body
        # Compression costs more than it saves on JPEG frames (ARCHITECTURE.md).
        "ws_per_message_deflate": False,
        "ws_max_size": max(settings.cdp_max_message_bytes, settings.max_request_bytes),
    }


class _PlainStartupFailure:
    """A start-up that fails for a reason of ours (another server on the state dir, an
    image that cannot be built or reached) is one line saying why, where uvicorn would log
    the traceback through every lifespan frame, the reason last. Any other failure keeps
    its traceback: that one is a bug."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []

        async def holding_failures(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent once the exception says what it was
            else:
                await send(message)

        try:
            await self.app(scope, receive, holding_failures)
        except DeskboxError as error:
            if held:
                held = [{"type": "lifespan.startup.failed",
                         "message": f"cannot start: {error.message}"}]
            raise
        finally:
            for message in held:
                await send(message)


def bind(host: str, port: int) -> list[socket.socket]:
    """The server's address, bound before start-up (as asyncio's create_server binds it:
    every address of ``host``, IPv6 ones v6-only); uvicorn listens on it once started.

    uvicorn binds after the app's start-up: a server told a port in use first built its
    image (minutes), re-adopted what a killed server left and, failing to bind, stopped
    every session it had just re-adopted. Until uvicorn listens, a connection is refused."""
    try:
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise InvalidSetting(f"cannot listen on {host!r}: {error.strerror}") from None
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as error:
        for sock in bound:
            sock.close()
        raise InvalidSetting(f"cannot listen on {_client_host(host)}:{port}: "
                             f"{error.strerror}") from None
    return bound


# Past this, some programs the sessions start (they inherit it) would walk every possible
# descriptor on start-up for nothing.
_OPEN_FILES = 65536


def raise_open_files_limit() -> int:
    """The soft limit on open files raised toward the hard one (at most ``_OPEN_FILES``);
    the limit now. A shell's is often 1024 (systemd's default: 1024 of 524288), and each
    session holds a few descriptors and each of its clients more: a server of a few hundred
    sessions would run out. Go's runtime does the same for every program."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def run(
    settings: Settings, log_level: str = "info", log_format: LogFormat = "auto"
) -> None:
    """Serve until SIGINT/SIGTERM; exits 3 if the server could not start."""
    chosen: Literal["json", "text"] = configure_logging(log_level, log_format)
    log.debug("open files: at most %d", raise_open_files_limit())
    try:
        listening = bind(settings.host, settings.port)
        app = create_app(settings)
    except DeskboxError as error:
        log.error("cannot start: %s", error.message)
        sys.exit(_STARTUP_FAILURE)
    # FastAPI builds its OpenAPI document on first use (~0.2 s here), which would stall
    # every session's actions at the first /openapi.json or 405 (whose Allow header comes
    # from it), a request anyone can make. Built now, it is also frozen with the rest.
    app.openapi()
    key_file = app.state.services.keyring.generated_path
    config = uvicorn.Config(
        _PlainStartupFailure(app),
        host=settings.host,
        port=settings.port,
        # A sixth less of the server's CPU per websocket action than asyncio's own loop
        # (bench/README "A click, layer by layer"). The agent keeps asyncio's: uvloop needs
        # ssl, which would cost every session 1.3 MiB, for no gain measured there.
        loop="uvloop",
        **protocol_options(settings, app.state.services.metrics),
        log_level=log_level.lower(),
        log_config=None,
        access_log=False,
        # A request stuck on a desktop must not hold the shutdown: its session is stopped
        # (its sandbox killed) right after.
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )
    # Event streams end at once, saying why (sessions/events.py), instead of holding the
    # stop for the grace.
    server = _Server(config, key_file, chosen, app.state.services.manager.events.close)
    try:
        server.run(sockets=listening)
    except KeyboardInterrupt:
        pass
    finally:
        for sock in listening:
            sock.close()
    if not server.started:
        sys.exit(_STARTUP_FAILURE)
