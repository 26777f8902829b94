"""Named calls (``POST /v1/call/<name>``): the pluggable part of the agent.

Other parts of the agent (actions, screenshot, clipboard) register a handler under a name.
A handler takes the JSON object of the request and returns either a JSON value or a
:class:`Blob` (bytes with a content type: a JPEG goes out as itself, not as base64). It
raises :class:`CallError` to answer with a status of the protocol's error shape.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["Blob", "CallError", "CallHandler", "Json", "Registry", "failure_answer"]

log = logging.getLogger("deskbox_agent")

Json: TypeAlias = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Blob:
    data: bytes
    content_type: str = "application/octet-stream"


class CallError(Exception):
    """A handler's refusal: ``status`` (4xx/5xx), a ``kind`` word and a message; for a
    batch of actions, ``action``: the index of the one that failed (PROTOCOL.md)."""

    def __init__(self, status: int, kind: str, message: str, action: int | None = None,
                 ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.action = action


def failure_answer(error: Exception, what: str) -> CallError:
    """What ``what`` (a call, a stream's handler) answers when it raised ``error``, which
    is not a :class:`CallError`: a handler's bug is a 500 (logged), but the sandbox at its
    pids limit is a 429 (no thread or process can start: its programs hold all it may
    have). Such a call cannot run now, the agent and its session are fine; a 500 made the
    host fail the session."""
    if not ((isinstance(error, RuntimeError) and "can't start new thread" in str(error))
            or (isinstance(error, OSError) and error.errno == errno.EAGAIN)):
        log.error("%s failed", what, exc_info=error)
        return CallError(500, "internal", f"{type(error).__name__}: {error}")
    held = ""
    try:
        with open("/sys/fs/cgroup/pids.current") as current, \
                open("/sys/fs/cgroup/pids.max") as limit:
            held = f" ({current.read().strip()} of {limit.read().strip()})"
    except OSError:
        pass
    return CallError(429, "process_limit",
                     f"the sandbox's processes and threads are at its limit{held}, the "
                     "session's resources.pids: end some of its programs and try again")


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
