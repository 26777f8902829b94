"""``GET /v1/sessions/{id}/events``: server-sent events of what happens to a session.

Each event is ``id: N``, ``event: <type>`` and ``data: <SessionEvent JSON>``
(schemas/events.py): state changes, and the browser's exits and restarts. The stream starts
with the events this server kept (after ``Last-Event-ID`` if sent, which may be an id of an
earlier server process: ids grow across them, see sessions/events.py) and ends after the
session has ended. A comment line every few seconds keeps proxies from closing it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import StreamingResponse

from ..schemas.events import SessionEvent
from ..sessions.lifecycle import LIVE_STATES, utcnow
from .deps import Caller, get_services

__all__ = ["HEARTBEAT_S", "router"]

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["sessions"])

HEARTBEAT_S = 10.0


def _frame(event: SessionEvent) -> str:
    return f"id: {event.id}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n"


@router.get(
    "/events",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def session_events(
    request: Request,
    caller: Caller,
    session_id: str,
    last_event_id: Annotated[int | None, Header(ge=0)] = None,
) -> StreamingResponse:
    manager = get_services(request).manager
    record = await manager.get(caller.key_id, session_id)
    log = manager.events
    after = last_event_id or 0

    async def frames() -> AsyncIterator[str]:
        if not log.history(session_id) and record.state not in LIVE_STATES:
            # Ended before this server started: only its final state is known. A new id,
            # above the Last-Event-ID of a client that saw the session live elsewhere.
            reason = record.failure.reason if record.failure else None
            yield _frame(SessionEvent(id=log.next_id(), type="state", at=utcnow(),
                                      session_id=session_id, state=record.state,
                                      reason=reason))
            return
        async for event in log.follow(session_id, after, heartbeat_s=HEARTBEAT_S):
            yield ": keepalive\n\n" if event is None else _frame(event)

    return StreamingResponse(
        frames(), media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
