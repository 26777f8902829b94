"""The synchronous client: :class:`Deskbox`, its :class:`Sessions` and :class:`Session`.

Each method describes its request with the shared base (``_base.py``) and sends it with
httpx; :class:`ActionsSocket` is the websocket fast path (``Session.actions_ws()``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

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

__all__ = ["ActionsSocket", "Deskbox", "Session", "Sessions"]


class Deskbox(BaseClient):
    """A Deskbox server, synchronously::

        with Deskbox() as box:                      # DESKBOX_URL, DESKBOX_API_KEY
            with box.sessions.create() as session:  # deleted on leaving the block
                session.click(100, 200)
                png = session.screenshot()

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
        transport: httpx.BaseTransport | None = None,
        verify: b.Verify = True,
        max_retries: int | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, verify, max_retries)
        self._http = httpx.Client(
            base_url=self.base_url, headers=self.headers, timeout=timeout, transport=transport,
            verify=self._tls,
        )
        self.sessions = Sessions(self)
        self.snapshots = Snapshots(self)
        self.volumes = Volumes(self)
        self.secrets = Secrets(self)

    def __enter__(self) -> Deskbox:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (sessions stay: delete them with ``session.close()``)."""
        self._http.close()

    def health(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /healthz`` (no key needed)."""
        body: dict[str, Any] = self._send(Call("GET", "/healthz", timeout=timeout))
        return body

    def _send(self, call: Call) -> Any:
        """Send ``call`` (again, up to ``max_retries`` times, while it is refused for
        capacity) and read its answer."""
        tries = 0
        while True:
            try:
                return self._send_once(call)
            except APIError as error:
                wait = self._retry_wait(error, tries)
                if wait is None:
                    raise
            time.sleep(wait)
            tries += 1

    def _send_once(self, call: Call) -> Any:
        try:
            response = self._http.request(
                call.method, call.path, params=tuple(call.params), json=call.json,
                content=call.content, timeout=self._timeout_for(call), headers=call.headers,
            )
        except (httpx.TransportError, httpx.DecodingError) as error:
            raise b.transport_error(error) from error
        return self._read(call, response)


class Snapshots:
    """``box.snapshots``: inspect, list, pool and delete snapshots (``session.snapshot()``
    takes one; ``box.sessions.create(from_snapshot=...)`` and ``session.fork(n)`` restore)."""

    def __init__(self, client: Deskbox) -> None:
        self._client = client

    def get(self, snapshot_id: str, *, timeout: float | None = None) -> Snapshot:
        body = self._client._send(b.snapshot_get_call(snapshot_id, timeout))
        return Snapshot(str(body["id"]), dict(body))

    def list(self, *, timeout: float | None = None) -> list[Snapshot]:
        return b.snapshots_of(self._client._send(b.snapshot_list_call(timeout)))

    def delete(self, snapshot_id: str, *, timeout: float | None = None) -> None:
        self._client._send(b.snapshot_delete_call(snapshot_id, timeout))

    def set_pool(self, snapshot_id: str, size: int, *, timeout: float | None = None
                 ) -> Snapshot:
        """Keep ``size`` (0–4) restored copies ready, so that a create ``from_snapshot``
        takes one at once (API.md "Warm pool"); 0 stops."""
        body = self._client._send(b.snapshot_pool_call(snapshot_id, size, timeout))
        return Snapshot(str(body["id"]), dict(body))


class Secrets:
    """``box.secrets``: this API key's secrets (API.md "Secrets"). A value goes in and never
    comes back: ``list`` gives names and allowed origins."""

    def __init__(self, client: Deskbox) -> None:
        self._client = client

    def create(self, name: str, value: str, allowed_origins: Sequence[str], *,
               timeout: float | None = None) -> dict[str, Any]:
        body = self._client._send(
            b.secret_create_call(name, value, allowed_origins, timeout))
        return dict(body)

    def list(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        body = self._client._send(b.secret_list_call(timeout))
        return [dict(item) for item in body["secrets"]]

    def delete(self, name: str, *, timeout: float | None = None) -> None:
        self._client._send(b.secret_delete_call(name, timeout))


class Volumes:
    """``box.volumes``: persistent volumes of this API key (API.md "Volumes and browser
    profiles"); ``box.sessions.create(volumes=[...], profile=...)`` mounts them."""

    def __init__(self, client: Deskbox) -> None:
        self._client = client

    def create(self, name: str, size_mb: int, *, timeout: float | None = None) -> Volume:
        return b.volume_of(self._client._send(b.volume_create_call(name, size_mb, timeout)))

    def get(self, name: str, *, timeout: float | None = None) -> Volume:
        return b.volume_of(self._client._send(b.volume_get_call(name, timeout)))

    def list(self, *, timeout: float | None = None) -> list[Volume]:
        body = self._client._send(b.volume_list_call(timeout))
        return [b.volume_of(item) for item in body["volumes"]]

    def delete(self, name: str, *, timeout: float | None = None) -> None:
        self._client._send(b.volume_delete_call(name, timeout))


class Sessions:
    """``box.sessions``: create, get and list sessions."""

    def __init__(self, client: Deskbox) -> None:
        self._client = client

    def create(
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
    ) -> Session:
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
        return Session(self._client, self._client._send(call))

    def get(self, session_id: str, *, timeout: float | None = None) -> Session:
        return Session(self._client, self._client._send(b.get_call(session_id, timeout)))

    def list(
        self, *, state: str | None = None, labels: Mapping[str, str] | None = None,
        limit: int | None = None, timeout: float | None = None,
    ) -> list[Session]:
        """The sessions of this key in ``state`` with all of ``labels``, newest first: all
        of them, or the newest ``limit`` (the server's pages, one request each)."""
        pages = b.SessionPages(state, labels, limit, timeout)
        while (call := pages.next_call()) is not None:
            pages.take(self._client._send(call))
        return [Session(self._client, item) for item in pages.items]

    def delete(self, session_id: str, *, timeout: float | None = None) -> None:
        """Destroy a session by id (idempotent, like ``DELETE /v1/sessions/{id}``)."""
        self._client._send(b.delete_call(session_id, timeout))


class Session(SessionBase[Deskbox]):
    """One desktop. Actions go over HTTP, or over the actions websocket while one is open
    (``with session.actions_ws(): ...``). As a context manager it deletes the session."""

    def __init__(self, client: Deskbox, data: SessionData | Mapping[str, Any]) -> None:
        super().__init__(client, data)
        self._socket: ActionsSocket | None = None

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def refresh(self, *, timeout: float | None = None) -> Session:
        """Read the session again (its ``state`` above all)."""
        self._update(self._client._send(self._get_call(timeout)))
        return self

    # actions ---------------------------------------------------------------------------

    def act(
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
            return self._socket.act(actions, screenshot=screenshot,
                                    coordinate_space=coordinate_space, timeout=timeout)
        call = self._act_call(actions, screenshot, coordinate_space, timeout)
        return ActionsResult.from_json(self._client._send(call))

    def click(
        self, x: int | None = None, y: int | None = None, *, button: str = "left",
        count: int = 1, modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        self.act(b.click(x, y, button, count, modifiers), timeout=timeout)

    def move(
        self, x: int, y: int, *, modifiers: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        """``modifiers``: keys held during the move (``["shift"]``)."""
        self.act(b.move(x, y, modifiers), timeout=timeout)

    def type(self, text: str, *, timeout: float | None = None) -> None:
        self.act(b.type_text(text), timeout=timeout)

    def key(self, keys: str, *, timeout: float | None = None) -> None:
        """``keys`` like ``"ctrl+shift+t"``, ``"Enter"``."""
        self.act(b.key(keys), timeout=timeout)

    def scroll(
        self, x: int | None = None, y: int | None = None, *, dx: int = 0, dy: int = 0,
        modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        """Wheel notches; ``dy > 0`` scrolls down."""
        self.act(b.scroll(x, y, dx, dy, modifiers), timeout=timeout)

    def drag(
        self, path: Sequence[tuple[int, int]], *, button: str = "left",
        modifiers: Sequence[str] | None = None, timeout: float | None = None,
    ) -> None:
        """``modifiers``: keys held from before the press to after the release (a
        shift-drag extends a selection)."""
        self.act(b.drag(path, button, modifiers), timeout=timeout)

    def act_anthropic(
        self,
        tool_input: Mapping[str, Any],
        *,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002 (the API's name)
        quality: int | None = None,
        timeout: float | None = None,
    ) -> AnthropicResult:
        """Run one ``input`` of Anthropic's ``computer`` tool (``POST /actions/anthropic``):
        the server translates it, acts, and answers with the ``tool_result`` content.

        ``coordinate_space`` is the display size the model was told (coordinates in, images
        out); ``format``/``quality`` those of the images. Always over HTTP. An input the
        server refuses raises :class:`~deskbox.UnprocessableEntity` (422) before anything
        ran; its message says what is wrong, for the model to read.
        """
        call = self._anthropic_call(tool_input, coordinate_space, format, quality, timeout)
        return self._anthropic_result(self._client._send(call))

    def act_openai(
        self,
        action: Action | Sequence[Action],
        *,
        call_id: str | None = None,
        coordinate_space: tuple[int, int] | None = None,
        format: str = "png",  # noqa: A002 (the API's name)
        quality: int | None = None,
        timeout: float | None = None,
    ) -> OpenAIResult:
        """Run a ``computer_call``'s action, or a list of them (the batched ``actions``), as
        ``POST /actions/openai`` does; the answer carries the ``computer_call_output``.

        ``action`` may also be the whole ``computer_call`` item. Options as in
        :meth:`act_anthropic`; a refused action raises before any of the call's actions ran.
        """
        call = self._openai_call(action, call_id, coordinate_space, format, quality, timeout)
        return self._openai_result(self._client._send(call))

    @overload
    def screenshot(
        self, *, format: str = ..., quality: int | None = ...,  # noqa: A002
        region: Mapping[str, int] | None = ..., scale: tuple[int, int] | None = ...,
        as_image: Literal[False] = ..., timeout: float | None = ...,
    ) -> bytes: ...

    @overload
    def screenshot(
        self, *, format: str = ..., quality: int | None = ...,  # noqa: A002
        region: Mapping[str, int] | None = ..., scale: tuple[int, int] | None = ...,
        as_image: Literal[True], timeout: float | None = ...,
    ) -> Image: ...

    def screenshot(
        self, *, format: str = "png", quality: int | None = None,  # noqa: A002
        region: Mapping[str, int] | None = None, scale: tuple[int, int] | None = None,
        as_image: bool = False, timeout: float | None = None,
    ) -> bytes | Image:
        """The screen as image bytes (PNG by default), or a PIL image with ``as_image``."""
        if self._socket is not None or region is not None:
            action = b.screenshot_action(format, quality, region, scale)
            result = self.act(action, timeout=timeout).results[0]
            assert isinstance(result, Screenshot)
            data = result.data
        else:
            data = self._client._send(self._screenshot_call(format, quality, scale, timeout))
        return to_image(data) if as_image else data

    def actions_ws(self, *, timeout: float | None = None) -> ActionsSocket:
        """Open the actions websocket; until it closes, this session's actions use it::

            with session.actions_ws():
                for _ in range(100):
                    session.click(10, 10)   # one websocket message each, no HTTP round trip
        """
        socket = ActionsSocket(self, timeout)
        self._socket = socket
        return socket

    # sandbox ---------------------------------------------------------------------------

    def exec(
        self, cmd: str | Sequence[str], *, timeout_s: float = 30,
        env: Mapping[str, str] | None = None, background: bool = False,
        secrets: Sequence[str] = (), timeout: float | None = None,
    ) -> ExecResult:
        """Run a command in the sandbox: an argv list, or a string run by ``sh -c``;
        ``secrets``: names of the API key's secrets given to it as environment variables."""
        call = self._exec_call(cmd, timeout_s, env, background, timeout, secrets)
        return self._exec_result(self._client._send(call))

    def upload(
        self, path: str, data: bytes | str | os.PathLike[str], *, timeout: float | None = None,
    ) -> Upload:
        """Write ``data`` (bytes, or a local file's path) to ``path`` in the sandbox."""
        content = data if isinstance(data, bytes) else Path(data).read_bytes()
        return self._upload_result(self._client._send(self._upload_call(path, content, timeout)))

    def download(self, path: str, *, timeout: float | None = None) -> bytes:
        data: bytes = self._client._send(self._download_call(path, timeout))
        return data

    # lifecycle -------------------------------------------------------------------------

    def pause(self, *, timeout: float | None = None) -> Session:
        """Freeze the session (memory kept)."""
        self._update(self._client._send(self._pause_call("freeze", timeout)))
        return self

    def hibernate(self, *, timeout: float | None = None) -> Session:
        """Checkpoint the session to disk and free its memory."""
        self._update(self._client._send(self._pause_call("hibernate", timeout)))
        return self

    def resume(self, *, timeout: float | None = None) -> Session:
        self._update(self._client._send(self._resume_call(timeout)))
        return self

    def keepalive(self, *, timeout: float | None = None) -> Session:
        """Extend the idle timeout."""
        self._update(self._client._send(self._keepalive_call(timeout)))
        return self

    def snapshot(self, *, timeout: float | None = None) -> Snapshot:
        return self._snapshot(self._client._send(self._snapshot_call(timeout)))

    def fork(self, n: int = 1, *, timeout: float | None = None) -> list[Session]:
        body = self._client._send(self._fork_call(n, timeout))
        return [Session(self._client, item) for item in self._forks(body)]

    def token(
        self, scope: TokenScope = "view", *, ttl_s: int = 600, timeout: float | None = None,
    ) -> Token:
        """A session token (``view``, ``control`` or ``cdp``) for URLs opened elsewhere."""
        return self._token(self._client._send(self._token_call(scope, ttl_s, timeout)))

    def view_url(
        self, scope: Literal["view", "control"] = "view", *, ttl_s: int = 600,
        timeout: float | None = None,
    ) -> str:
        """A link to the live view (read-only with ``view``), carrying a fresh token."""
        return self._view_url(self.token(scope, ttl_s=ttl_s, timeout=timeout))

    # recordings ------------------------------------------------------------------------

    def start_recording(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Record from now on (actions, frames, events); the recording resource."""
        return dict(self._client._send(self._recording_call("start", timeout)))

    def stop_recording(self, *, timeout: float | None = None) -> dict[str, Any]:
        """Stop recording; it is kept (past the session) until it expires."""
        return dict(self._client._send(self._recording_call("stop", timeout)))

    def trajectory(self, *, timeout: float | None = None) -> list[dict[str, Any]]:
        """The recording's entries in time order: actions (with the frames before and
        after them), frames and events."""
        return self._entries(self._client._send(self._trajectory_call(timeout)))

    def recording(self, path: str | os.PathLike[str] | None = None, *,
                  timeout: float | None = None) -> bytes:
        """The recording's video (MP4, H.264); also written to ``path`` if given."""
        data: bytes = self._client._send(self._recording_file_call("recording.mp4", timeout))
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def export(self, path: str | os.PathLike[str] | None = None, *,
               timeout: float | None = None) -> bytes:
        """The recording as a zip: trajectory.jsonl, recording.json, frames/, shots/."""
        data: bytes = self._client._send(self._recording_file_call("trajectory.zip", timeout))
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def ask_for_help(self, reason: str, *, timeout: float | None = None
                     ) -> dict[str, Any]:
        """Tell the humans watching that the agent needs one (an event; the session is
        marked as needing help); the session's handoff state."""
        return dict(self._client._send(self._handoff_call(reason, None, timeout)))

    def wait_for_human(self, reason: str, *, timeout_s: float = 600,
                       timeout: float | None = None) -> dict[str, Any]:
        """Ask for help and wait until a human has taken control in the live view and handed
        it back (or ``timeout_s``, at most 600); the session's handoff state. Meanwhile the
        agent's actions answer 409 ``human_in_control``."""
        return dict(self._client._send(self._handoff_call(reason, timeout_s, timeout)))

    def cdp_url(self, *, ttl_s: int = 600, timeout: float | None = None) -> str:
        """For ``playwright.chromium.connect_over_cdp(url)``, carrying a fresh cdp token."""
        return self._cdp_url(self.token("cdp", ttl_s=ttl_s, timeout=timeout))

    def close(self, *, timeout: float | None = None) -> None:
        """Destroy the session (idempotent)."""
        if self._socket is not None:
            self._socket.close()
        self._client._send(self._delete_call(timeout))


class ActionsSocket:
    """``WS /v1/sessions/{id}/actions/ws``: one action per message, no HTTP round trip.

    Opened by :meth:`Session.actions_ws`; a context manager. ``act`` sends the actions one
    after the other and stops at the first error, like ``POST /actions``.
    """

    def __init__(self, session: Session, timeout: float | None) -> None:
        self._session = session
        self._timeout = session._client.timeout if timeout is None else timeout
        self._next_id = 0
        try:
            url = session._actions_ws_url()
            self._ws: ClientConnection = connect(
                url,
                additional_headers=session._client.headers,
                compression=None,
                open_timeout=self._timeout,
                max_size=None,
                **session._client._ws_options(url),
            )
            # Entered as a context manager (websockets ≥ 17.1 warns about bare connections).
            self._ws.__enter__()
        except InvalidStatus as error:
            response = error.response
            raise b.handshake_error(
                response.status_code, list(response.headers.raw_items()),
                bytes(response.body or b""),
            ) from error
        except (OSError, TimeoutError, WebSocketException) as error:
            raise APIConnectionError(f"could not open the actions websocket: {error}") from error

    def __enter__(self) -> ActionsSocket:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._session._socket is self:
            self._session._socket = None
        self._ws.close()

    def act(
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
            self._send(b.ws_message(self._next_id, action, screenshot if last else None,
                                    coordinate_space))
            wait = timeout if timeout is not None else b.act_timeout(self._timeout, [action])
            result, shot, settled = b.ws_result(*self._reply(wait, self._next_id))
            results.append(result)
        return ActionsResult(results, shot, settled)

    def _send(self, text: str) -> None:
        """Send one message. A socket that cannot send is closed: kept, it failed every
        later call; the session's next calls go over HTTP."""
        try:
            self._ws.send(text)
        except (WebSocketException, OSError) as error:
            self.close()
            raise APIConnectionError(f"the actions websocket broke: {error}") from error

    def _reply(self, wait: float, sent_id: int) -> tuple[dict[str, Any], list[bytes]]:
        """The reply to the message ``sent_id``, waited for ``wait`` seconds. A socket whose
        reply did not come in time is closed: that late reply would be read as the next
        call's (stale results, an image's bytes taken for JSON); the session's next calls go
        over HTTP."""
        try:
            text = self._ws.recv(timeout=wait)
            reply: dict[str, Any] = b.ws_reply(text, sent_id)
            frames = []
            for _ in range(int(reply.get("binary_frames", 0))):
                frame = self._ws.recv(timeout=wait)
                frames.append(frame if isinstance(frame, bytes) else frame.encode())
        except TimeoutError as error:
            self.close()
            raise b.transport_error(error) from error
        except (WebSocketException, b.OutOfStep) as error:
            self.close()
            raise APIConnectionError(f"the actions websocket broke: {error}") from error
        except BaseException:
            # An interrupted wait (Ctrl-C in a notebook) leaves the reply to come, as a
            # timeout does.
            self.close()
            raise
        return reply, frames

