"""A session browser's DevTools server, reached over one connection at a time.

Chromium listens on ``127.0.0.1:DEVTOOLS_PORT`` of the desktop's loopback (a sandbox has its
own, so the port is the same in all of them). Nothing on the host listens for it and no port
is forwarded to it: each connection is a TCP channel of the desktop's agent
(agent_devtools.py), bridged to a socket; :func:`connect_tcp` connects one directly (tests).

The browser is hostile like everything in the sandbox: replies are read with a size limit,
with a timeout, and parsed strictly (:func:`get_json`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from .. import untrusted_json
from ..errors import BrowserUnavailable, NotFound, Timeout

__all__ = [
    "MAX_LISTING",
    "DevtoolsSocket",
    "Opener",
    "browser_path",
    "connect_tcp",
    "get_json",
    "open_websocket",
]

MAX_HEADERS = 64 * 1024
MAX_LISTING = 4 * 1024 * 1024  # /json/version, /json/list
CONNECT_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 1.0
_BROWSER_PATH = re.compile(r"^/devtools/browser/[A-Za-z0-9-]{1,64}$")


@dataclass
class DevtoolsSocket:
    """A TCP connection to a browser's DevTools server; ``host`` is its ``Host:`` value."""

    sock: socket.socket
    host: str

    def close(self) -> None:
        self.sock.close()


async def _connect(sock: socket.socket, port: int, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            await loop.sock_connect(sock, ("127.0.0.1", port))
    except TimeoutError:
        sock.close()
        message = f"the browser's DevTools did not accept a connection in {timeout_s} s"
        raise Timeout(message) from None
    except OSError as error:
        sock.close()
        raise BrowserUnavailable(
            f"the session's browser does not accept DevTools connections ({error.strerror}); "
            "if it just exited, the session restarts it: retry shortly"
        ) from None
    except BaseException:  # cancelled
        sock.close()
        raise


async def connect_tcp(port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> DevtoolsSocket:
    """A connection to ``127.0.0.1:port`` of the host (the unisolated local backend)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # DevTools messages are small and pipelined: Nagle would hold one back until the
    # previous one is acknowledged.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    await _connect(sock, port, timeout_s)
    return DevtoolsSocket(sock, f"127.0.0.1:{port}")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = parts[1] if len(parts) >= 2 else ""
    if not (parts[0].startswith("HTTP/1.") and status.isascii() and status.isdigit()):
        raise BrowserUnavailable("the browser's DevTools answered something that is not HTTP")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(status), headers


async def get_json(
    devtools: DevtoolsSocket, path: str, limit: int, timeout_s: float = 10.0
) -> object:
    """``GET path`` on the DevTools HTTP server; the JSON body (at most ``limit`` bytes).

    Consumes (and closes) the connection. BrowserUnavailable for a non-200 answer, a body
    that is too large or not JSON.
    """
    try:
        reader, writer = await asyncio.open_connection(sock=devtools.sock, limit=MAX_HEADERS)
    except OSError as error:
        devtools.close()
        raise BrowserUnavailable(f"the browser's DevTools connection failed: {error}") from None
    except BaseException:
        devtools.close()
        raise
    try:
        async with asyncio.timeout(timeout_s):
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {devtools.host}\r\nAccept: application/json\r\n"
                "Connection: close\r\n\r\n".encode("ascii")
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _parse_head(head[:-4])
            length = headers.get("content-length")
            if length is not None:
                if not (length.isascii() and length.isdigit()) or int(length) > limit:
                    raise BrowserUnavailable(f"the browser's answer to {path} is too large")
                body = await reader.readexactly(int(length))
            else:
                body = b""
                while len(body) <= limit and (chunk := await reader.read(limit + 1 - len(body))):
                    body += chunk
                if len(body) > limit:
                    raise BrowserUnavailable(f"the browser's answer to {path} is too large")
    except TimeoutError:
        raise Timeout(f"the browser's DevTools did not answer {path} in {timeout_s} s") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as error:
        message = f"the browser's DevTools answer was cut short: {error!r}"
        raise BrowserUnavailable(message) from None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if status != 200:
        raise BrowserUnavailable(f"the browser's DevTools answered {path} with HTTP {status}")
    try:
        return untrusted_json.loads(body)
    except ValueError:
        raise BrowserUnavailable(f"the browser's answer to {path} is not JSON") from None


class _DevtoolsConnection(ClientConnection):
    """A client connection that ends ``close_timeout`` after it failed, whatever the peer.

    When the browser breaks the protocol (a message over ``max_size``), websockets sends
    its close frame and then waits for the browser to close the TCP connection, applying
    the timeout only when we send or close. A browser that never does would keep a reader
    waiting forever, with no close for its client: abort at the deadline instead.
    """

    _abort_at: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.close_deadline is not None and self._abort_at is None:
            self._abort_at = self.loop.call_at(self.close_deadline, self.transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._abort_at is not None:
            self._abort_at.cancel()
        super().connection_lost(exc)


Opener = Callable[[], Awaitable[DevtoolsSocket]]
"""Makes a new connection to one browser's DevTools (``DesktopHandle.open_devtools``)."""


def url_path(url: object) -> str:
    """The path of a URL the browser (a sandbox's process) sent; "" for anything else,
    "ws://[x/" included (urlsplit raises ValueError on it)."""
    if not isinstance(url, str):
        return ""
    try:
        return urlsplit(url).path
    except ValueError:
        return ""


async def browser_path(open_devtools: Opener) -> str:
    """The path of the browser-level DevTools websocket, from ``/json/version``."""
    version = await get_json(await open_devtools(), "/json/version", MAX_LISTING)
    url = version.get("webSocketDebuggerUrl") if isinstance(version, dict) else None
    path = url_path(url)
    if not _BROWSER_PATH.match(path):
        raise BrowserUnavailable("the browser's /json/version names no browser websocket")
    return path


async def open_websocket(
    open_devtools: Opener, path: str, max_size: int, timeout_s: float = 10.0
) -> ClientConnection:
    """A DevTools websocket at ``path``; messages larger than ``max_size`` close it (1009).

    NotFound when the browser refuses the path (no such target), BrowserUnavailable when it
    cannot be reached.
    """
    devtools = await open_devtools()
    try:
        return await connect(
            f"ws://{devtools.host}{path}",
            sock=devtools.sock,
            max_size=max_size,
            compression=None,
            open_timeout=timeout_s,
            ping_interval=None,  # a process on the same machine: a dead one resets the socket
            # The sandbox's browser answers a close at once, or is not let hold the
            # connection (and what it sent on it) any longer.
            close_timeout=CLOSE_TIMEOUT_S,
            create_connection=_DevtoolsConnection,
            # The relay reads each message at once (api/cdp_relay.py): the library keeps at
            # most one more, plus the frame it is reading.
            max_queue=1,
            user_agent_header=None,
        )
    except InvalidStatus as error:
        devtools.close()
        status = error.response.status_code
        if status == 404 or status == 500:
            raise NotFound(f"the browser has no DevTools target at {path}") from None
        message = f"the browser refused the DevTools websocket: HTTP {status}"
        raise BrowserUnavailable(message) from None
    except TimeoutError:
        devtools.close()
        raise Timeout(f"the browser's DevTools websocket did not open in {timeout_s} s") from None
    except (OSError, WebSocketException, ValueError) as error:
        # ValueError: a redirect, which the library cannot follow on our own socket.
        devtools.close()
        raise BrowserUnavailable(f"the browser's DevTools websocket failed: {error}") from None
    except BaseException:  # cancelled
        devtools.close()
        raise
