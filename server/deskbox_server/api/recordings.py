"""Recordings and trajectories (API.md "Recordings and trajectories"): start and stop a
session's recording, read it back (trajectory, frames, video, zip export), list and delete
an API key's recordings. They outlive their sessions until they expire."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse, StreamingResponse

from ..errors import DeskboxError, NotFound
from ..schemas.recordings import Recording, RecordingList
from ..sessions import recording_media as media
from ..sessions.listing import MAX_PAGE, decode_cursor, encode_cursor
from ..sessions.recording_store import RecordingMeta, recording_position
from .deps import NO_BODY, Caller, Services, get_services

__all__ = ["router"]

router = APIRouter(tags=["recordings"])
_SESSION = "/v1/sessions/{session_id}"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NDJSON = "application/x-ndjson"


def _resource(meta: RecordingMeta) -> Recording:
    return Recording.model_validate(meta.model_dump(exclude={"owner", "entries"}))


def _recording(services: Services, owner: str, session_id: str) -> RecordingMeta:
    if not _ID.match(session_id):
        raise NotFound(f"session {session_id!r} has no recording")
    return services.manager.recordings.store.owned(owner, session_id)


async def _flushed(services: Services, owner: str, session_id: str) -> RecordingMeta:
    """The recording, with what its recorder still holds written first (a read sees every
    action made before it)."""
    meta = _recording(services, owner, session_id)
    recorder = services.manager.recordings.recorder(session_id)
    if recorder is not None:
        await recorder.flush()
    return meta


@router.post(_SESSION + "/recording/start", response_model=Recording, dependencies=NO_BODY)
async def start_recording(request: Request, caller: Caller, session_id: str) -> Recording:
    """Record the session from now on; a stopped recording of it goes on (appended)."""
    session = await get_services(request).manager.session(caller.key_id, session_id, "live")
    return _resource(await session.start_recording())


@router.post(_SESSION + "/recording/stop", response_model=Recording, dependencies=NO_BODY)
async def stop_recording(request: Request, caller: Caller, session_id: str) -> Recording:
    services = get_services(request)
    try:
        session = await services.manager.session(caller.key_id, session_id, "live")
    except DeskboxError:  # it ended: so did its recording
        return _resource(_recording(services, caller.key_id, session_id))
    return _resource(await session.stop_recording())


@router.get(_SESSION + "/recording", response_model=Recording)
async def get_recording(request: Request, caller: Caller, session_id: str) -> Recording:
    return _resource(_recording(get_services(request), caller.key_id, session_id))


@router.delete(_SESSION + "/recording", status_code=204)
async def delete_recording(request: Request, caller: Caller, session_id: str) -> Response:
    """Stop it if it records, then delete it with its frames and video."""
    services = get_services(request)
    _recording(services, caller.key_id, session_id)
    await services.manager.recordings.end(session_id)
    await asyncio.to_thread(services.manager.recordings.store.delete, caller.key_id, session_id)
    return Response(status_code=204)


@router.get("/v1/recordings", response_model=RecordingList)
async def list_recordings(
    request: Request,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="recordings per page")] = 100,
    cursor: Annotated[str | None, Query(max_length=512,
                                        description="the last page's next_cursor")] = None,
) -> RecordingList:
    """This key's recordings, newest first, in pages like ``GET /v1/sessions``."""
    store = get_services(request).manager.recordings.store
    after = decode_cursor(cursor) if cursor is not None else None
    metas, more = store.page(caller.key_id, after, limit)
    return RecordingList(
        recordings=[_resource(m) for m in metas],
        next_cursor=encode_cursor(recording_position(metas[-1])) if more else None,
    )


@router.get(_SESSION + "/trajectory", response_class=Response,
            responses={200: {"content": {_NDJSON: {}}}})
async def get_trajectory(request: Request, caller: Caller, session_id: str) -> Response:
    """JSON lines in time order: actions (with their frames), frames, events."""
    services = get_services(request)
    meta = await _flushed(services, caller.key_id, session_id)
    store = services.manager.recordings.store
    recorded = await asyncio.to_thread(media.trajectory, store, meta)
    # A line at a time, read from the file as it is sent (Starlette iterates a plain
    # iterator on a worker thread).
    return StreamingResponse(media.trajectory_lines(recorded), media_type=_NDJSON)


@router.get(_SESSION + "/recording/frames/{n}", response_class=FileResponse,
            responses={200: {"content": {"image/jpeg": {}}}})
async def get_frame(request: Request, caller: Caller, session_id: str, n: int) -> Response:
    services = get_services(request)
    meta = await _flushed(services, caller.key_id, session_id)
    path = media.frame_path(services.manager.recordings.store, meta, n)
    return FileResponse(path, media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=3600"})


@router.get(_SESSION + "/recording.mp4", response_class=FileResponse,
            responses={200: {"content": {"video/mp4": {}}}})
async def get_video(request: Request, caller: Caller, session_id: str) -> Response:
    """The frames as H.264 video (encoded on the first request, then kept if it fits in
    the key's quota)."""
    services = get_services(request)
    meta = await _flushed(services, caller.key_id, session_id)
    video = await services.manager.recordings.videos.video(meta)
    if isinstance(video, Path):
        return FileResponse(video, media_type="video/mp4", filename=f"{session_id}.mp4")
    size = (await asyncio.to_thread(os.fstat, video.fileno())).st_size
    return StreamingResponse(media.file_chunks(video), media_type="video/mp4", headers={
        "Content-Length": str(size),
        "Content-Disposition": f'attachment; filename="{session_id}.mp4"'})


@router.get(_SESSION + "/trajectory.zip", response_class=StreamingResponse,
            responses={200: {"content": {"application/zip": {}}}})
async def export_recording(request: Request, caller: Caller, session_id: str) -> Response:
    """trajectory.jsonl, recording.json, frames/ and shots/ in one zip, made as it is sent."""
    services = get_services(request)
    meta = await _flushed(services, caller.key_id, session_id)
    parts = await asyncio.to_thread(media.export, services.manager.recordings.store, meta)
    # Its chunks are read on Starlette's threads, a file at a time: none waits on the
    # client holding one, nor on the loop's default executor.
    return StreamingResponse(media.zip_chunks(parts), media_type="application/zip", headers={
        "Content-Disposition": f'attachment; filename="{session_id}-trajectory.zip"'})
