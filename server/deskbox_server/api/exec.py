"""Commands and files inside a session's sandbox: ``POST /exec``, ``PUT/GET /files``.

Everything runs in the sandbox (the session's ``exec``/``read_file``/``write_file``); a
backend without a sandbox refuses with 422. Sizes are capped by the settings
``exec_output_max_bytes`` (stdout and stderr each; beyond it output is dropped and flagged),
``exec_max_timeout_s`` and ``file_max_bytes`` (413 over it, uploads and downloads alike).

A command that outlives ``timeout_s`` is killed with its process tree and answered with
200, ``"timed_out": true``, ``"exit_code": null`` and the output it had written: the
partial output is often what explains the hang.
A command whose client disconnects before the answer is killed the same way at once
(disconnect.py).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..errors import InvalidRequest
from ..sandbox_io import MAX_PATH_BYTES, ExecCommand, check_sandbox_path
from ..schemas.exec import ExecRequest, ExecResponse, FileWritten
from ..settings import Settings
from .deps import Caller, get_services
from .disconnect import ClientLeft, unless_client_leaves
from .errors import PayloadTooLarge

__all__ = ["body_limit", "router"]

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["exec"])

_FILES_PATH = re.compile(r"^/v1/sessions/[^/]+/files/?$")

SandboxPath = Annotated[
    str,
    Query(
        min_length=1,
        max_length=MAX_PATH_BYTES,
        description="Absolute path inside the session's sandbox (resolved in there).",
        # Documented only: check_sandbox_path() says better than pydantic what is wrong.
        json_schema_extra={"pattern": "^/"},
    ),
]


def body_limit(settings: Settings) -> Callable[[Scope], int | None]:
    """For RequestContext: uploads may be as large as ``file_max_bytes``."""

    def limit(scope: Scope) -> int | None:
        if scope.get("method") == "PUT" and _FILES_PATH.match(str(scope.get("path", ""))):
            return settings.file_max_bytes
        return None

    return limit


@router.post("/exec", response_model=ExecResponse)
async def exec_command(
    request: Request, caller: Caller, session_id: str, body: ExecRequest
) -> ExecResponse:
    """Run ``cmd`` (an argv list) inside the sandbox, with DISPLAY set to the session's."""
    services = get_services(request)
    settings = services.settings
    if body.timeout_s > settings.exec_max_timeout_s:
        raise InvalidRequest(
            f"timeout_s may be at most {settings.exec_max_timeout_s:g} on this server"
        )
    command = ExecCommand(
        argv=tuple(body.cmd),
        env=dict(body.env),
        timeout_s=body.timeout_s,
        background=body.background,
        output_limit=settings.exec_output_max_bytes,
    )
    session = await services.manager.session(caller.key_id, session_id)
    try:
        # Killed if its caller leaves: run on to its timeout, it would hold one of the
        # session's exec slots and keep the session busy, for nobody.
        result = await unless_client_leaves(request, session.exec(command, tuple(body.secrets)))
    except ClientLeft:
        services.metrics.execs.inc("client_left")
        raise
    outcome = "timed_out" if result.timed_out else "background" if body.background else "exited"
    services.metrics.execs.inc(outcome)
    return ExecResponse(
        exit_code=result.exit_code,
        stdout=result.stdout.decode(errors="replace"),
        stderr=result.stderr.decode(errors="replace"),
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        timed_out=result.timed_out,
        pid=result.pid,
        duration_ms=round(result.duration_s * 1000),
    )


@router.put(
    "/files",
    response_model=FileWritten,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                "format": "binary"}}},
        }
    },
)
async def upload_file(
    request: Request, caller: Caller, session_id: str, path: SandboxPath
) -> FileWritten:
    """Write the request body (raw bytes) to ``path`` inside the sandbox, replacing it.

    At most ``file_max_bytes`` (413 beyond, and the old file stays as it was). Writing
    where the sandbox cannot (its read-only root) is 403; a missing directory is 404.
    """
    services = get_services(request)
    check_sandbox_path(path)
    limit = services.settings.file_max_bytes
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise PayloadTooLarge(f"the upload is larger than this server's limit of {limit} bytes")
    session = await services.manager.session(caller.key_id, session_id)
    size = await session.write_file(path, request.stream(), limit)
    services.metrics.file_bytes.inc("upload", amount=size)
    return FileWritten(path=path, size=size)


class _StreamThenClose(StreamingResponse):
    """Streams, then closes what it read from, however the response ends."""

    def __init__(
        self, content: AsyncIterator[bytes], closer: AsyncExitStack, headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type="application/octet-stream", headers=headers)
        self._closer = closer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._closer.aclose()


@router.get(
    "/files",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def download_file(
    request: Request, caller: Caller, session_id: str, path: SandboxPath
) -> Response:
    """The bytes of the regular file ``path`` inside the sandbox.

    404 when it does not exist, 422 for a directory or another non-regular file, 413 when
    larger than ``file_max_bytes``. Errors come before any byte is sent.
    """
    services = get_services(request)
    check_sandbox_path(path)
    limit = services.settings.file_max_bytes
    session = await services.manager.session(caller.key_id, session_id)
    closer = AsyncExitStack()
    download = await closer.enter_async_context(session.read_file(path, limit))
    metrics = services.metrics

    async def chunks() -> AsyncIterator[bytes]:
        async for chunk in download.chunks():
            metrics.file_bytes.inc("download", amount=len(chunk))
            yield chunk

    headers = {"Content-Length": str(download.size)} if download.size > 0 else {}
    return _StreamThenClose(chunks(), closer, headers)
