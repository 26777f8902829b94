"""The asynchronous client: :class:`AsyncDeskbox`, :class:`AsyncSessions`, :class:`AsyncSession`.

The same methods as the sync client (a test pins that), awaited; :class:`AsyncActionsSocket`
is the websocket fast path (``async with session.actions_ws(): ...``).
"""
# ruff: noqa: ASYNC109 -- a per-call ``timeout=`` is the SDK convention (STYLE.md)

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from . import _base as b
from ._base import Action, BaseClient, Call, ScreenshotOption, SessionBase, TokenScope
from ._errors import APIConnectionError, APIError
from ._models import (
    ActionsResult,
    AnthropicResult,
    ExecResult,
    OpenAIResult,
    Screenshot,
    SessionData,
    Snapshot,
    Token,
    Upload,
    Volume,
    to_image,
)

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["AsyncActionsSocket", "AsyncDeskbox", "AsyncSession", "AsyncSessions"]


class AsyncDeskbox(BaseClient):
    """A Deskbox server, asynchronously::

        async with AsyncDeskbox() as box:                        # DESKBOX_URL, DESKBOX_API_KEY
            async with await box.sessions.create() as session:  # deleted on leaving
                await session.click(100, 200)
                png = await session.screenshot()

    ``timeout`` (seconds) applies to every call unless the call passes its own.
    ``transport`` swaps httpx's network layer (tests: ``httpx.MockTransport``).
    ``verify``: what to trust of a server behind TLS, for every call and websocket: a CA
    bundle's path, an ``ssl.SSLContext``, False for nothing checked; by default httpx's
    authorities (certifi's), or ``$SSL_CERT_FILE`` when set.
    ``max_retries``: how many times a call refused for capacity (429, 503: too many
    sessions, commands or tokens; the server did nothing) is sent again, each after the
    answer's Retry-After (at most 60 s); then its :class:`RateLimited` or
    :class:`ServiceUnavailable` is raised. 0 raises it at once; by default
    ``$DESKBOX_MAX_RETRIES``, or 0.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = b.DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: b.Verify = True,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, verify, max_retries)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport,
            verify=self._tls,
        )
        self.sessions = AsyncSessions(self)
        self.snapshots = AsyncSnapshots(self)
        self.volumes = AsyncVolumes(self)
        self.secrets = AsyncSecrets(self)

    async def __aenter__(self) -> AsyncDeskbox:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection pool (sessions stay: delete them with ``session.close()``)."""
        await self._http.aclose()

    async def health(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /healthz`` (no key needed)."""
        body: dict[str, Any] = await self._send(Call("GET", "/healthz", timeout=timeout))
        return body

    async def _send(self, call: Call) -> Any:
        """Send ``call`` (again, up to ``max_retries`` times, while it is refused for
        capacity) and read its answer."""
        tries = 0
        while True:
            try:
                return await self._send_once(call)
            except APIError as error:
                wait = self._retry_wait(error, tries)
                if wait is None:
                    raise
            await asyncio.sleep(wait)
            tries += 1

    async def _send_once(self, call: Call) -> Any:
        try:
            response = await self._http.request(
                call.method, call.path, params=tuple(call.params), json=call.json,
                content=call.content, timeout=self._timeout_for(call), headers=call.headers,
            )
        except (httpx.TransportError, httpx.DecodingError) as error:
            raise b.transport_error(error) from error
        return self._read(call, response)


class AsyncSnapshots:
    """``box.snapshots``: inspect, list, pool and delete snapshots (``session.snapshot()``
    takes one; ``box.sessions.create(from_snapshot=...)`` and ``session.fork(n)`` restore)."""

    def __init__(self, client: AsyncDeskbox) -> None:
        self._client = client

    async def get(self, snapshot_id: str, *, timeout: float | None = None) -> Snapshot:
        body = await self._client._send(b.snapshot_get_call(snapshot_id, timeout))
        return Snapshot(str(body["id"]), dict(body))

    async def list(self, *, timeout: float | None = None) -> list[Snapshot]:
        return b.snapshots_of(await self._client._send(b.snapshot_list_call(timeout)))

    async def delete(self, snapshot_id: str, *, timeout: float | None = None) -> None:
        await self._client._send(b.snapshot_delete_call(snapshot_id, timeout))

    async def set_pool(self, snapshot_id: str, size: int, *, timeout: float | None = None
                 ) -> Snapshot:
        """Keep ``size`` (0–4) restored copies ready, so that a create ``from_snapshot``
        takes one at once (API.md "Warm pool"); 0 stops."""
        body = await self._client._send(b.snapshot_pool_call(snapshot_id, size, timeout))
        return Snapshot(str(body["id"]), dict(body))


class AsyncSecrets:
    """``box.secrets``: this API key's secrets (API.md "Secrets"). A value goes in and never
    comes back: ``list`` gives names and allowed origins."""

    def __init__(self, client: AsyncDeskbox) -> None:
        self._client = client

    async def create(self, name: str, value: str, allowed_origins: Sequence[str], *,
               timeout: float | None = None) -> dict[str, Any]:
        body = await self._client._send(
            b.secret_create_call(name, value, allowed_origins, timeout))
        return dict(body)

    async def list(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        body = await self._client._send(b.secret_list_call(timeout))
        return [dict(item) for item in body["secrets"]]

    async def delete(self, name: str, *, timeout: float | None = None) -> None:
        await self._client._send(b.secret_delete_call(name, timeout))


class AsyncVolumes:
    """``box.volumes``: persistent volumes of this API key (API.md "Volumes and browser
    profiles"); ``box.sessions.create(volumes=[...], profile=...)`` mounts them."""

    def __init__(self, client: AsyncDeskbox) -> None:
        self._client = client

    async def create(self, name: str, size_mb: int, *, timeout: float | None = None) -> Volume:
        return b.volume_of(await self._client._send(b.volume_create_call(name, size_mb, timeout)))

    async def get(self, name: str, *, timeout: float | None = None) -> Volume:
        return b.volume_of(await self._client._send(b.volume_get_call(name, timeout)))

    async def list(self, *, timeout: float | None = None) -> list[Volume]:
        body = await self._client._send(b.volume_list_call(timeout))
        return [b.volume_of(item) for item in body["volumes"]]

    async def delete(self, name: str, *, timeout: float | None = None) -> None:
        await self._client._send(b.volume_delete_call(name, timeout))


class AsyncSessions:
    """``box.sessions``: create, get and list sessions."""

    def __init__(self, client: AsyncDeskbox) -> None:
        self._client = client

    async def create(
        self,
        *,
        display: Mapping[str, int] | None = None,
        start_url: str | None = None,
        backend: str | None = None,
        from_snapshot: str | None = None,
        timeout_s: int | None = None,
        labels: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
        network: Mapping[str, Any] | None = None,
        record: bool | None = None,
        coordinate_space: tuple[int, int] | None = None,
        volumes: Sequence[Mapping[str, Any]] | None = None,
        profile: str | None = None,
        wait: bool = True,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncSession:
        """A new session (``POST /v1/sessions``), running unless ``wait=False``.
        ``volumes``: ``[{"name", "path", "read_only"}]`` to mount; ``profile``: the volume
        that keeps the browser's profile. ``idempotency_key``: a key of yours (1-255 printable
        ASCII characters); sent again after a timeout or a broken connection, the create
        answers the session the first one made instead of a second (API.md). A create that
        waits does so for at least 600 s (``CREATE_WAIT_S``): a VM starts slowly."""
        if timeout is None and wait:
            timeout = max(self._client.timeout, b.CREATE_WAIT_S)
        call = b.create_call(display, start_url, backend, from_snapshot, timeout_s, labels,
                             resources, network, record, coordinate_space, wait, timeout,
                             volumes, profile, idempotency_key)
        return AsyncSession(self._client, await self._client._send(call))

    async def get(self, session_id: str, *, timeout: float | None = None) -> AsyncSession:
        body = await self._client._send(b.get_call(session_id, timeout))
        return AsyncSession(self._client, body)

    async def list(
        self, *, state: str | None = None, labels: Mapping[str, str] | None = None,
        limit: int | None = None, timeout: float | None = None,
    ) -> list[AsyncSession]:
        """The sessions of this key in ``state`` with all of ``labels``, newest first: all
        of them, or the newest ``limit`` (the server's pages, one request each)."""
        pages = b.SessionPages(state, labels, limit, timeout)
        while (call := pages.next_call()) is not None:
            pages.take(await self._client._send(call))
        return [AsyncSession(self._client, item) for item in pages.items]

    async def delete(self, session_id: str, *, timeout: float | None = None) -> None:
        """Destroy a session by id (idempotent, like ``DELETE /v1/sessions/{id}``)."""
        await self._client._send(b.delete_call(session_id, timeout))


class AsyncSession(SessionBase[AsyncDeskbox]):
    """One desktop. Actions go over HTTP, or over the actions websocket while one is open
    (``with session.actions_ws(): ...``). As a context manager it deletes the session."""

    def __init__(self, client: AsyncDeskbox, data: SessionData | Mapping[str, Any]) -> None:
        super().__init__(client, data)
        self._socket: AsyncActionsSocket | None = None

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def refresh(self, *, timeout: float | None = None) -> AsyncSession:
        """Read the session again (its ``state`` above all)."""
        self._update(await self._client._send(self._get_call(timeout)))
        return self

    # actions ---------------------------------------------------------------------------

    async def act(
        self,
        actions: Action | Sequence[Action],
        *,
        screenshot: ScreenshotOption = None,
        coordinate_space: tuple[int, int] | None = None,
        timeout: float | None = None,
    ) -> ActionsResult:
        """Run one action or a list in order (API.md "Actions"); ``screenshot=True`` (or a
        ``{"format", "quality"}`` dict) adds a screenshot taken once the screen settled."""
        if self._socket is not None:
            return await self._socket.act(actions, screenshot=screenshot,
                                    coordinate_space=coordinate_space, timeout=timeout)
        call = self._act_call(actions, screenshot, coordinate_space, timeout)
        return ActionsResult.from_json(await self._client._send(call))

    async def click(
        self, x: int | None = None, y: int | None = None, *, button: str = "left",
        count: int = 1, modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        await self.act(b.click(x, y, button, count, modifiers), timeout=timeout)

    async def move(
        self, x: int, y: int, *, modifiers: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """``modifiers``: keys held during the move (``["shift"]``)."""
        await self.act(b.move(x, y, modifiers), timeout=timeout)

    async def type(self, text: str, *, timeout: float | None = None) -> None:
        await self.act(b.type_text(text), timeout=timeout)

    async def key(self, keys: str, *, timeout: float | None = None) -> None:
        """``keys`` like ``"ctrl+shift+t"``, ``"Enter"``."""
        await self.act(b.key(keys), timeout=timeout)

    async def scroll(
        self, x: int | None = None, y: int | None = None, *, dx: int = 0, dy: int = 0,
        modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        """Wheel notches; ``dy > 0`` scrolls down."""
        await self.act(b.scroll(x, y, dx, dy, modifiers), timeout=timeout)

    async def drag(
        self, path: Sequence[tuple[int, int]], *, button: str = "left",
        modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        """``modifiers``: keys held from before the press to after the release (a
        shift-drag extends a selection)."""
        await self.act(b.drag(path, button, modifiers), timeout=timeout)

    async def act_anthropic(
        self,
        tool_input: Mapping[str, Any],
        *,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002 (the API's name)
        quality: int | None = None,
        timeout: float | None = None,
    ) -> AnthropicResult:
        """Run one input of Anthropic's computer tool (``POST /actions/anthropic``):
        :meth:`deskbox.Session.act_anthropic`, awaited."""
        call = self._anthropic_call(tool_input, coordinate_space, format, quality, timeout)
        return self._anthropic_result(await self._client._send(call))

    async def act_openai(
        self,
        action: Action | Sequence[Action],
        *,
        call_id: str | None = None,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002 (the API's name)
        quality: int | None = None,
        timeout: float | None = None,
    ) -> OpenAIResult:
        """Run a ``computer_call``'s action(s) (``POST /actions/openai``):
        :meth:`deskbox.Session.act_openai`, awaited."""
        call = self._openai_call(action, call_id, coordinate_space, format, quality, timeout)
        return self._openai_result(await self._client._send(call))

    @overload
    async def screenshot(
        self, *, format: str = ..., quality: int | None = ...,  # noqa: A002
        region: Mapping[str, int] | None = ..., scale: tuple[int, int] | None = ...,
        as_image: Literal[False] = ..., timeout: float | None = ...,
    ) -> bytes: ...

    @overload
    async def screenshot(
        self, *, format: str = ..., quality: int | None = ...,  # noqa: A002
        region: Mapping[str, int] | None = ..., scale: tuple[int, int] | None = ...,
        as_image: Literal[True], timeout: float | None = ...,
    ) -> Image: ...

    async def screenshot(
        self, *, format: str = "png", quality: int | None = None,  # noqa: A002
        region: Mapping[str, int] | None = None, scale: tuple[int, int] | None = None,
        as_image: bool = False, timeout: float | None = None,
    ) -> bytes | Image:
        """The screen as image bytes (PNG by default), or a PIL image with ``as_image``."""
        if self._socket is not None or region is not None:
            action = b.screenshot_action(format, quality, region, scale)
            result = (await self.act(action, timeout=timeout)).results[0]
            assert isinstance(result, Screenshot)
            data = result.data
        else:
            data = await self._client._send(self._screenshot_call(format, quality, scale, timeout))
        return to_image(data) if as_image else data

    def actions_ws(self, *, timeout: float | None = None) -> AsyncActionsSocket:
        """The actions websocket; while it is open, this session's actions use it::

            async with session.actions_ws():
                for _ in range(100):
                    await session.click(10, 10)   # one websocket message each
        """
        return AsyncActionsSocket(self, timeout)

    # sandbox ---------------------------------------------------------------------------

    async def exec(
        self, cmd: str | Sequence[str], *, timeout_s: float = 30,
        env: Mapping[str, str] | None = None, background: bool = False,
        secrets: Sequence[str] = (), timeout: float | None = None,
    ) -> ExecResult:
        """Run a command in the sandbox: an argv list, or a string run by ``sh -c``;
        ``secrets``: names of the API key's secrets given to it as environment variables."""
        call = self._exec_call(cmd, timeout_s, env, background, timeout, secrets)
        return self._exec_result(await self._client._send(call))

    async def upload(
        self, path: str, data: bytes | str | os.PathLike[str], *, timeout: float | None = None,
    ) -> Upload:
        """Write ``data`` (bytes, or a local file's path) to ``path`` in the sandbox."""
        if isinstance(data, bytes):
            content = data
        else:
            content = await asyncio.to_thread(Path(data).read_bytes)
        call = self._upload_call(path, content, timeout)
        return self._upload_result(await self._client._send(call))

    async def download(self, path: str, *, timeout: float | None = None) -> bytes:
        data: bytes = await self._client._send(self._download_call(path, timeout))
        return data

    # lifecycle -------------------------------------------------------------------------

    async def pause(self, *, timeout: float | None = None) -> AsyncSession:
        """Freeze the session (memory kept)."""
        self._update(await self._client._send(self._pause_call("freeze", timeout)))
        return self

    async def hibernate(self, *, timeout: float | None = None) -> AsyncSession:
        """Checkpoint the session to disk and free its memory."""
        self._update(await self._client._send(self._pause_call("hibernate", timeout)))
        return self

    async def resume(self, *, timeout: float | None = None) -> AsyncSession:
        self._update(await self._client._send(self._resume_call(timeout)))
        return self

    async def keepalive(self, *, timeout: float | None = None) -> AsyncSession:
        """Extend the idle timeout."""
        self._update(await self._client._send(self._keepalive_call(timeout)))
        return self

    async def snapshot(self, *, timeout: float | None = None) -> Snapshot:
        return self._snapshot(await self._client._send(self._snapshot_call(timeout)))

    async def fork(self, n: int = 1, *, timeout: float | None = None) -> list[AsyncSession]:
        body = await self._client._send(self._fork_call(n, timeout))
        return [AsyncSession(self._client, item) for item in self._forks(body)]

    async def token(
        self, scope: TokenScope = "view", *, ttl_s: int = 600, timeout: float | None = None,
    ) -> Token:
        """A session token (``view``, ``control`` or ``cdp``) for URLs opened elsewhere."""
        return self._token(await self._client._send(self._token_call(scope, ttl_s, timeout)))

    async def view_url(
        self, scope: Literal["view", "control"] = "view", *, ttl_s: int = 600,
        timeout: float | None = None,
    ) -> str:
        """A link to the live view (read-only with ``view``), carrying a fresh token."""
        return self._view_url(await self.token(scope, ttl_s=ttl_s, timeout=timeout))

    # recordings ------------------------------------------------------------------------

    async def start_recording(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Record from now on (actions, frames, events); the recording resource."""
        return dict(await self._client._send(self._recording_call("start", timeout)))

    async def stop_recording(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Stop recording; it is kept (past the session) until it expires."""
        return dict(await self._client._send(self._recording_call("stop", timeout)))

    async def trajectory(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """The recording's entries in time order: actions (with the frames before and
        after them), frames and events."""
        return self._entries(await self._client._send(self._trajectory_call(timeout)))

    async def recording(self, path: str | os.PathLike[str] | None = None, *,
                  timeout: float | None = None) -> bytes:
        """The recording's video (MP4, H.264); also written to ``path`` if given."""
        data: bytes = await self._client._send(self._recording_file_call("recording.mp4", timeout))
        if path is not None:
            await asyncio.to_thread(Path(path).write_bytes, data)
        return data

    async def export(self, path: str | os.PathLike[str] | None = None, *,
               timeout: float | None = None) -> bytes:
        """The recording as a zip: trajectory.jsonl, recording.json, frames/, shots/."""
        data: bytes = await self._client._send(self._recording_file_call("trajectory.zip", timeout))
        if path is not None:
            await asyncio.to_thread(Path(path).write_bytes, data)
        return data

    async def ask_for_help(self, reason: str, *, timeout: float | None = None
                     ) -> dict[str, Any]:
        """Tell the humans watching that the agent needs one (an event; the session is
        marked as needing help); the session's handoff state."""
        return dict(await self._client._send(self._handoff_call(reason, None, timeout)))

    async def wait_for_human(self, reason: str, *, timeout_s: float = 600,
                       timeout: float | None = None) -> dict[str, Any]:
        """Ask for help and wait until a human has taken control in the live view and handed
        it back (or ``timeout_s``, at most 600); the session's handoff state. Meanwhile the
        agent's actions answer 409 ``human_in_control``."""
        return dict(await self._client._send(self._handoff_call(reason, timeout_s, timeout)))

    async def cdp_url(self, *, ttl_s: int = 600, timeout: float | None = None) -> str:
        """For ``playwright.chromium.connect_over_cdp(url)``, carrying a fresh cdp token."""
        return self._cdp_url(await self.token("cdp", ttl_s=ttl_s, timeout=timeout))

    async def close(self, *, timeout: float | None = None) -> None:
        """Destroy the session (idempotent)."""
        if self._socket is not None:
            await self._socket.close()
        await self._client._send(self._delete_call(timeout))



class AsyncActionsSocket:
    """``WS /v1/sessions/{id}/actions/ws``: one action per message, no HTTP round trip.

    From :meth:`AsyncSession.actions_ws`; connects on ``async with`` (or ``await
    socket.connect()``). ``act`` sends the actions one after the other and stops at the
    first error, like ``POST /actions``.
    """

    def __init__(self, session: AsyncSession, timeout: float | None) -> None:
        self._session = session
        self._timeout = session._client.timeout if timeout is None else timeout
        self._next_id = 0
        self._ws: ClientConnection | None = None

    async def connect(self) -> AsyncActionsSocket:
        try:
            url = self._session._actions_ws_url()
            self._ws = await connect(
                url,
                additional_headers=self._session._client.headers,
                compression=None,
                open_timeout=self._timeout,
                max_size=None,
                **self._session._client._ws_options(url),
            )
        except InvalidStatus as error:
            response = error.response
            raise b.handshake_error(
                response.status_code, list(response.headers.raw_items()),
                bytes(response.body or b""),
            ) from error
        except (OSError, TimeoutError, WebSocketException) as error:
            raise APIConnectionError(f"could not open the actions websocket: {error}") from error
        self._session._socket = self
        return self

    async def __aenter__(self) -> AsyncActionsSocket:
        return await self.connect()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session._socket is self:
            self._session._socket = None
        if self._ws is not None:
            await self._ws.close()

    async def act(
        self,
        actions: Action | Sequence[Action],
        *,
        screenshot: ScreenshotOption = None,
        coordinate_space: tuple[int, int] | None = None,
        timeout: float | None = None,
    ) -> ActionsResult:
        items = b.action_list(actions)
        results: list[dict[str, Any] | Screenshot] = []
        shot: Screenshot | None = None
        settled = True
        for index, action in enumerate(items):
            last = index == len(items) - 1
            self._next_id += 1
            await self._send(b.ws_message(self._next_id, action, screenshot if last else None,
                                          coordinate_space))
            wait = timeout if timeout is not None else b.act_timeout(self._timeout, [action])
            result, shot, settled = b.ws_result(*await self._reply(wait, self._next_id))
            results.append(result)
        return ActionsResult(results, shot, settled)

    def _connection(self) -> ClientConnection:
        if self._ws is None:
            raise APIConnectionError("the actions websocket is not connected (use async with)")
        return self._ws

    async def _send(self, text: str) -> None:
        """Send one message. A socket that cannot send is closed: kept, it failed every
        later call; the session's next calls go over HTTP."""
        ws = self._connection()
        try:
            await ws.send(text)
        except (WebSocketException, OSError) as error:
            await self.close()
            raise APIConnectionError(f"the actions websocket broke: {error}") from error
        except BaseException:
            # Cancelled mid-send, whether the message went is unknown: a reply may come.
            await self.close()
            raise

    async def _reply(self, wait: float, sent_id: int
                     ) -> tuple[dict[str, Any], list[bytes]]:
        """The reply to the message ``sent_id``, waited for ``wait`` seconds. A socket whose
        reply did not come in time is closed: that late reply would be read as the next
        call's (stale results, an image's bytes taken for JSON); the session's next calls go
        over HTTP."""
        ws = self._connection()
        try:
            async with asyncio.timeout(wait):
                text = await ws.recv()
                reply: dict[str, Any] = b.ws_reply(text, sent_id)
                frames = []
                for _ in range(int(reply.get("binary_frames", 0))):
                    frame = await ws.recv()
                    frames.append(frame if isinstance(frame, bytes) else frame.encode())
        except TimeoutError as error:
            await self.close()
            raise b.transport_error(error) from error
        except (WebSocketException, b.OutOfStep) as error:
            await self.close()
            raise APIConnectionError(f"the actions websocket broke: {error}") from error
        except BaseException:
            # A cancelled wait (the caller's wait_for, a task group's) leaves the reply to
            # come, as a timeout does.
            await self.close()
            raise
        return reply, frames
