"""HTTP/1.1 connections that must send each request's head in time.

uvicorn bounds the idle time between requests (its keep-alive timeout, reset by any byte),
but neither a connection that sends nothing nor the time a request's head takes once its
first byte came (uvicorn issue #157): a client could hold any number of connections open
for ever by sending a header line now and then (slowloris). The body has its own bound
(api/errors.py, ``body_idle_timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["head_deadline_protocol"]

log = logging.getLogger("deskbox.http")


def head_deadline_protocol(
    timeout_s: float, on_overdue: Callable[[], None] = lambda: None
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    ``timeout_s`` after it opened or after the answer to its last request; ``on_overdue``
    is called for each one closed."""

    class HeadDeadline(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._await_head()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _waiting_for_head(self) -> bool:
            # h11's IDLE: before a request's head is whole. After it the state is the body's,
            # DONE, or a websocket upgrade's (the transport then belongs to that protocol).
            return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def _await_head(self) -> None:
            """The timer runs from when the connection began waiting for a head."""
            if not self._waiting_for_head():
                self._stop_head_timer()
            elif self._head_timer is None:
                self._head_timer = self.loop.call_later(timeout_s, self._head_overdue)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_overdue(self) -> None:
            self._head_timer = None
            if self._waiting_for_head():
                log.info("closed a connection from %s: no whole request head within %g s",
                         self.client[0] if self.client else "?", timeout_s)
                on_overdue()
                self.transport.close()

    return HeadDeadline
