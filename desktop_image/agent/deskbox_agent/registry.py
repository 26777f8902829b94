"""Named calls (``POST /v1/call/<name>``): the pluggable part of the agent.

Other parts of the agent (actions, screenshot, clipboard) register a handler under a name.
A handler takes the JSON object of the request and returns either a JSON value or a
:class:`Blob` (bytes with a content type: a JPEG goes out as itself, not as base64). It
raises :class:`CallError` to answer with a status of the protocol's error shape.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["Blob", "CallError", "CallHandler", "Json", "Registry"]

Json: TypeAlias = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Blob:
    data: bytes
    content_type: str = "application/octet-stream"


class CallError(Exception):
    """A handler's refusal: ``status`` (4xx/5xx), a ``kind`` word and a message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


CallHandler: TypeAlias = Callable[[Mapping[str, Json]], Awaitable[Json | Blob]]


class Registry:
    """Call names to handlers; filled when the agent starts, never at import."""

    def __init__(self) -> None:
        self._handlers: dict[str, CallHandler] = {}

    def register(self, name: str, handler: CallHandler) -> None:
        if not _NAME.match(name):
            raise ValueError(f"bad call name {name!r}")
        if name in self._handlers:
            raise ValueError(f"call {name!r} is registered already")
        self._handlers[name] = handler

    def get(self, name: str) -> CallHandler | None:
        return self._handlers.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._handlers))
