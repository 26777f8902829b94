"""``/v1/sessions``: create, list, get, delete, pause, resume, keepalive."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from ..errors import InvalidRequest
from ..schemas.pause import PauseRequest
from ..schemas.sessions import (
    MAX_LABELS,
    Session,
    SessionCreate,
    SessionList,
    SessionState,
    SessionUrls,
)
from ..sessions.lifecycle import SessionRecord
from ..sessions.listing import MAX_PAGE, SessionQuery, decode_cursor
from .deps import NO_BODY, Caller, get_services

__all__ = ["router", "to_resource"]

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

REPLAYED_HEADER = "Idempotent-Replayed"
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
    description="a key of the client's (1-255 printable ASCII characters): a retry of the "
                "create with the same key answers the session the first made",
)]


def to_resource(record: SessionRecord, request: Request) -> Session:
    http = str(request.base_url).rstrip("/") + f"/v1/sessions/{record.id}"
    ws = "ws" + http.removeprefix("http")
    return Session(
        id=record.id,
        state=record.state,
        backend=record.backend,
        display=record.body.display,
        browser=record.body.browser,
        created_at=record.created_at,
        expires_at=record.expires_at,
        timeout_s=record.timeout_s,
        labels=record.body.labels,
        coordinate_space=record.body.coordinate_space,
        volumes=record.body.volumes,
        failure=record.failure,
        ended_at=record.ended_at,
        engine=get_services(request).manager.engine_details(record.backend),
        urls=SessionUrls(
            actions_ws=f"{ws}/actions/ws",
            vnc_ws=f"{ws}/vnc",
            view=f"{http}/view",
            cdp_http=f"{http}/cdp",
            cdp_ws=f"{ws}/cdp",
        ),
    )


def _labels(filters: list[str]) -> dict[str, str]:
    if len(filters) > MAX_LABELS:
        raise InvalidRequest(f"label: at most {MAX_LABELS} filters (a session has at most "
                             f"{MAX_LABELS} labels)")
    labels: dict[str, str] = {}
    for item in filters:
        key, sep, value = item.partition(":")
        if not sep or not key:
            raise InvalidRequest(f"label filter {item!r} is not of the form key:value")
        labels[key] = value
    return labels


@router.post("", status_code=201, response_model=Session)
async def create_session(
    request: Request,
    caller: Caller,
    response: Response,
    body: SessionCreate | None = None,
    wait: Annotated[bool, Query(description="false: answer at once, in `starting`")] = True,
    idempotency_key: IdempotencyKey = None,
) -> Session:
    manager = get_services(request).manager
    body = body or SessionCreate()
    if idempotency_key is None:
        record = await manager.create(caller.key_id, body, wait=wait)
    else:
        record, replayed = await manager.create_once(caller.key_id, body, idempotency_key, wait)
        if replayed:
            response.headers[REPLAYED_HEADER] = "true"
    return to_resource(record, request)


@router.get("", response_model=SessionList)
async def list_sessions(
    request: Request,
    caller: Caller,
    state: Annotated[list[SessionState], Query(description="repeat for any of several")] = [],  # noqa: B006
    label: Annotated[list[str], Query(description="key:value; repeat to require several")] = [],  # noqa: B006
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="sessions per page")] = 100,
    cursor: Annotated[str | None, Query(max_length=512,
                                        description="the last page's next_cursor")] = None,
) -> Response:
    query = SessionQuery(
        owner=caller.key_id, states=frozenset(state), labels=_labels(label),
        after=decode_cursor(cursor) if cursor is not None else None, limit=limit,
    )
    records, next_cursor = await get_services(request).manager.list(query)
    page = SessionList(sessions=[to_resource(r, request) for r in records],
                       next_cursor=next_cursor)
    # Encoded once, by pydantic's own encoder: FastAPI would validate the page again and
    # encode it twice. Not on a thread: the loop then waits for the GIL at each of its turns
    # (bench/listing.py: a click's p50 during listings went from 1.9 to 4.7 ms).
    return Response(page.model_dump_json(by_alias=True), media_type="application/json")


@router.get("/{session_id}", response_model=Session)
async def get_session(request: Request, caller: Caller, session_id: str) -> Session:
    record = await get_services(request).manager.get(caller.key_id, session_id)
    return to_resource(record, request)


@router.delete("/{session_id}", status_code=204, response_class=Response)
async def delete_session(request: Request, caller: Caller, session_id: str) -> Response:
    await get_services(request).manager.delete(caller.key_id, session_id)
    return Response(status_code=204)


@router.post("/{session_id}/pause", response_model=Session)
async def pause(
    request: Request, caller: Caller, session_id: str, body: PauseRequest | None = None
) -> Session:
    """Freeze the session (409 `conflict` for actions until resumed); see API.md."""
    mode = (body or PauseRequest()).mode
    session = await get_services(request).manager.session(caller.key_id, session_id, "live")
    record = await session.pause(mode)
    return to_resource(record, request)


@router.post("/{session_id}/resume", response_model=Session, dependencies=NO_BODY)
async def resume(request: Request, caller: Caller, session_id: str) -> Session:
    session = await get_services(request).manager.session(caller.key_id, session_id, "live")
    record = await session.resume()
    return to_resource(record, request)


@router.post("/{session_id}/keepalive", response_model=Session, dependencies=NO_BODY)
async def keepalive(request: Request, caller: Caller, session_id: str) -> Session:
    record = await get_services(request).manager.keepalive(caller.key_id, session_id)
    return to_resource(record, request)
