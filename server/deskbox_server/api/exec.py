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

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection
from starlette.types import Message, Receive, Scope, Send

from ..errors import DeskboxError, InvalidRequest
from ..sandbox_io import MAX_PATH_BYTES, ExecCommand, check_sandbox_path
from ..schemas.exec import ExecRequest, ExecResponse, FileWritten
from ..settings import Settings
from .abort import abort_connection
from .deps import Caller, get_services
from .disconnect import ClientLeft, unless_client_leaves
from .errors import PayloadTooLarge

__all__ = ["body_limit", "router"]

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["exec"])
log = logging.getLogger("deskbox.files")

_ABORTED_S = 1.0  # for the server to see an aborted connection go (a loop turn or two)

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


class _Stalled(Exception):
    """The client took nothing of the download for the send timeout."""


class _StreamThenClose(StreamingResponse):
    """Streams, then closes what it read from, however the response ends.

    Once the head is sent, a download that cannot go on (the file shrank, the session
    ended) or whose client takes nothing for ``send_timeout_s`` ends with its connection
    aborted, so that the client sees it cut. Raised on, it was logged as a server bug;
    and a client that stopped reading held one of the session's transfer slots, and kept
    the session busy (never idle, never hibernated), for as long as it stayed connected.
    """

    def __init__(
        self, content: AsyncIterator[bytes], closer: AsyncExitStack, headers: dict[str, str],
        send_timeout_s: float, cut: Callable[[Exception], None],
    ) -> None:
        super().__init__(content, media_type="application/octet-stream", headers=headers)
        self._closer = closer
        self._send_timeout_s = send_timeout_s
        self._cut = cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded_send(message: Message) -> None:
            try:
                async with asyncio.timeout(self._send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _Stalled(
                    f"the client took nothing for {self._send_timeout_s:g} s") from None

        try:
            await super().__call__(scope, receive, bounded_send)
        except (DeskboxError, _Stalled) as error:
            if not abort_connection(HTTPConnection(scope)):
                raise
            self._cut(error)
            # Until the server has seen the connection go: an answer left unfinished on a
            # connection it still holds is an error of the app's to it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_ABORTED_S):
                    while (await receive())["type"] != "http.disconnect":
                        pass
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
    larger than ``file_max_bytes``. Errors come before any byte is sent; one after ends
    the connection, the download cut (_StreamThenClose).
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

    def cut(error: Exception) -> None:
        log.info("session %s: the download of %s was cut short: %s", session_id, path, error)
        if isinstance(error, _Stalled):
            metrics.slow_clients.inc("download")

    headers = {"Content-Length": str(download.size)} if download.size > 0 else {}
    return _StreamThenClose(chunks(), closer, headers, services.settings.ws_send_timeout_s, cut)
