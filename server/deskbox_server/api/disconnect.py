"""Work of a request that ends when its client goes.

Neither uvicorn (h11) nor Starlette's ``request_response`` cancels a handler whose client
disconnected: the handler runs on to its end, and only its answer is dropped. For most
requests that is a moment; for an exec it was the command running to its ``timeout_s``
(up to an hour) in one of the session's exec slots, the session counted busy all along
(its pause, hibernate and snapshot refused, its idle timeout held off), and as many such
requests as it has slots (8 by default) left it answering 429 to every command and file
transfer for that long. A handoff's
``wait=true`` stayed parked up to 10 minutes.

:func:`unless_client_leaves` runs such work beside a watch of the request's ``receive``
for ``http.disconnect``, as Starlette's ``StreamingResponse`` watches during a stream, and
cancels the work when the client goes. The request then ends with :class:`ClientLeft`,
answered (to nobody: uvicorn drops it) with nginx's 499, so that the access log tells a
client that left from one that was answered, and no error is logged for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive

__all__ = ["CLIENT_CLOSED_REQUEST", "ClientLeft", "client_left_response", "unless_client_leaves"]

T = TypeVar("T")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for it: what operators grep access logs for


class ClientLeft(Exception):
    """The client disconnected before its answer; its work was cancelled and has ended."""


async def client_left_response(_request: Request, _error: Exception) -> Response:
    """The exception handler for :class:`ClientLeft` (api/errors.py installs it)."""
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _disconnected(receive: Receive) -> None:
    # Once the body has been read, uvicorn's receive answers only the disconnect (or a
    # bodiless message after a spurious wake-up, passed over).
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_client_leaves(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result; ClientLeft if the client disconnected first (``work`` was then
    cancelled). Only once the request's body has been read: the watch would take it."""
    task = asyncio.create_task(work)
    watch = asyncio.create_task(_disconnected(request.receive))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Unless the work is done, the client left or the request itself was cancelled
        # (the server's stop). Either way the request ends only after its work has: what
        # the work holds (an exec slot, the session's busy count, its command in the
        # sandbox) is let go by then.
        watch.cancel()
        task.cancel()
        await asyncio.wait((task, watch))
    if task.cancelled():
        if not watch.cancelled() and (error := watch.exception()) is not None:
            raise error  # the body's read failed (it had not been read): its own error
        raise ClientLeft
    return task.result()
