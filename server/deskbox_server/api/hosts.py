"""Which names the server answers to, and which pages may open its websockets.

DNS rebinding: a page of ``evil.example`` whose name the attacker re-points at 127.0.0.1
(or a LAN address) reads the server's keyless routes (``/healthz``, ``/metrics``,
``/openapi.json``) as its own origin. Its requests carry ``Host: evil.example``: a Host
that is no IP address, not ``localhost`` and not a name the operator listed
(``DESKBOX_ALLOWED_HOSTS``) is refused 403 ``forbidden``. An IP address is never a
rebinding (that needs the attacker's name), nor is ``localhost`` (browsers resolve it
themselves).

Websockets are outside the browser's same-origin rule: any page may open one to any
server, and its ``Origin`` says whose page it is. A websocket whose Origin is present and
names neither the request's own host nor a listed name is refused at its handshake (403).
Clients that are no browser (the SDK, the CLI, Playwright) send no Origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from ..errors import Forbidden
from .errors import ErrorCounter, deskbox_error_response

__all__ = ["HostCheck", "HostPolicy", "host_name"]

_ALWAYS = frozenset({"localhost"})


def host_name(authority: str) -> str | None:
    """The name or address of a ``Host`` value (``name:port``, ``[v6]:port``), lower
    case, without the root's dot; None when it is none."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        name, bracket, port = authority[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            return None
        port = port.removeprefix(":")
    else:
        name, _, port = authority.partition(":")
    if port and not port.isdigit():
        return None
    return name.removesuffix(".") or None


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first ``name`` header, the one Starlette's ``Headers`` (and so the routes) read."""
    return next((value for key, value in scope.get("headers", []) if key.lower() == name),
                None)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """``allowed``: names (``desk.example.org``), domains with their subdomains
    (``.example.org``) and ``*`` (any Host), as settings.py checked them. ``listen_host``:
    where the server was told to listen; a name there is the operator's own (an address
    needs no entry, and would let its pages' websockets in whatever the Host)."""

    def __init__(self, allowed: Iterable[str], listen_host: str = "") -> None:
        own = [] if _is_address(listen_host) else [listen_host]
        entries = {entry.lower().removesuffix(".") for entry in [*allowed, *own] if entry}
        self.any_host = "*" in entries
        self.names = frozenset(entry for entry in entries if not entry.startswith("."))
        self.domains = tuple(entry for entry in entries if entry.startswith("."))

    def listed(self, name: str) -> bool:
        return (name in self.names or name.endswith(self.domains)
                or f".{name}" in self.domains)

    def host_allowed(self, name: str) -> bool:
        return self.any_host or name in _ALWAYS or _is_address(name) or self.listed(name)

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        """A page's Origin may open a websocket when its host is the request's own (any
        port: a proxy may drop the port from Host) or a listed name. ``*`` lets any Host
        in, not any page: it turns off the rebinding check, not this one."""
        try:
            name = urlsplit(origin).hostname  # "null" (a sandboxed frame, file:): None
        except ValueError:
            return False
        if not name:
            return False
        name = name.removesuffix(".")
        return name == host or self.listed(name)


class HostCheck:
    """Pure ASGI middleware: HTTP requests and websockets alike, refused with the error
    body (a websocket by a denial of its handshake) when the policy says no."""

    def __init__(self, app: ASGIApp, policy: HostPolicy,
                 count: ErrorCounter | None = None) -> None:
        self.app = app
        self.policy = policy
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        response = deskbox_error_response(refusal, self.count)
        if scope["type"] == "websocket":
            await WebSocket(scope, receive, send).send_denial_response(response)
        else:
            await response(scope, receive, send)

    def _refusal(self, scope: Scope) -> Forbidden | None:
        host = _header(scope, b"host")
        # No Host at all (HTTP/1.0): no browser sends that.
        name = None if host is None else host_name(host.decode("latin-1"))
        if host is not None and (name is None or not self.policy.host_allowed(name)):
            shown = host.decode("latin-1")[:100]
            return Forbidden(
                f"this server does not answer to the host name {shown!r}: a name other "
                "than an IP address or localhost must be listed in DESKBOX_ALLOWED_HOSTS "
                "(it keeps pages of other sites from reaching the server by DNS rebinding)")
        origin = _header(scope, b"origin")
        if scope["type"] == "websocket" and origin is not None:
            said = origin.decode("latin-1")
            if not self.policy.origin_allowed(said, name):
                return Forbidden(
                    f"a websocket from a page of {said[:100]!r} is refused: its origin is "
                    "not this server's host, nor listed in DESKBOX_ALLOWED_HOSTS")
        return None
