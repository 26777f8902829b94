"""The paths of protocol 1 (PROTOCOL.md), each a coroutine taking the request's stream."""

from __future__ import annotations

import json
import re
import time

from . import PROTOCOL, VERSION
from .callstream import invoke, serve_calls
from .channels import relay_tcp, relay_unix
from .execute import parse_exec, run_exec
from .files import get_file, put_file
from .h2server import Stream
from .limits import Limits
from .registry import Json, Registry

__all__ = ["Router"]

_CALL = re.compile(r"^/v1/call/([a-z][a-z0-9_.-]{0,63})$")
_TCP = re.compile(r"^/v1/channels/tcp/([0-9]{1,5})$")


class Router:
    def __init__(self, registry: Registry, limits: Limits) -> None:
        self.registry = registry
        self.limits = limits
        self.started = time.monotonic()

    async def __call__(self, stream: Stream) -> None:
        path, method = stream.path, stream.method
        if path == "/v1/hello" and method == "GET":
            await stream.json(200, {"protocol": PROTOCOL, "agent": VERSION,
                                    "calls": list(self.registry)})
        elif path == "/v1/health" and method == "GET":
            await stream.json(200, {"status": "ok",
                                    "uptime_s": round(time.monotonic() - self.started, 3)})
        elif path == "/v1/exec" and method == "POST":
            body = await self._json_body(stream)
            if body is None:
                return
            spec = parse_exec(body, self.limits)
            if isinstance(spec, str):
                await stream.error(400, "bad_request", spec)
            else:
                await run_exec(stream, spec)
        elif path == "/v1/files" and method == "GET":
            await get_file(stream, self.limits)
        elif path == "/v1/files" and method == "PUT":
            await put_file(stream, self.limits)
        elif (m := _CALL.match(path)) and method == "POST":
            await self._call(stream, m.group(1))
        elif path == "/v1/calls" and method == "POST":
            await serve_calls(stream, self.registry, self.limits)
        elif (m := _TCP.match(path)) and method == "POST":
            port = int(m.group(1))
            if not 0 < port < 65536:
                await stream.error(400, "bad_request", f"no port {port}")
            else:
                await relay_tcp(stream, port, self.limits)
        elif path == "/v1/channels/unix" and method == "POST":
            target = stream.query.get("path", "")
            if not target.startswith("/") or "\x00" in target or len(target) > 107:
                await stream.error(400, "bad_request", "need an absolute socket path=")
            else:
                await relay_unix(stream, target, self.limits)
        else:
            await stream.error(404, "not_found", f"no {method} {path} in protocol {PROTOCOL}")

    async def _json_body(self, stream: Stream) -> dict[str, Json] | None:
        raw = await stream.body(self.limits.max_request_body, self.limits.request_body_timeout_s)
        if raw is None:
            return None
        try:
            value = json.loads(raw or b"{}")
        except ValueError as e:
            await stream.error(400, "bad_request", f"the body is not JSON: {e}")
            return None
        if not isinstance(value, dict):
            await stream.error(400, "bad_request", "the body must be a JSON object")
            return None
        return value

    async def _call(self, stream: Stream, name: str) -> None:
        if self.registry.get(name) is None:
            await stream.error(404, "unknown_call", f"no call named {name!r}")
            return
        body = await self._json_body(stream)
        if body is None:
            return
        status, content_type, data = await invoke(self.registry, name, body)
        await stream.respond(status, content_type, flush=False)
        await stream.write(data, end=True)
