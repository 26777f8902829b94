"""What the sync and async clients share, with no I/O: configuration, the requests each call
makes (:class:`Call`), how answers are read, and the actions' JSON.

:class:`~deskbox.Deskbox` and :class:`~deskbox.AsyncDeskbox` only send a :class:`Call`
(httpx) and hand the answer back here; the websocket fast path likewise only moves frames.
"""

from __future__ import annotations

import json
import os
import shlex
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

import httpx

from ._errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    error_for_status,
)
from ._errors import status_for_kind as _status_for_kind
from ._models import (
    AnthropicResult,
    ExecResult,
    OpenAIResult,
    Screenshot,
    SessionData,
    Snapshot,
    Token,
    Upload,
    Volume,
)

__all__ = [
    "BACKEND_HELP",
    "SETTLED_HEADER",
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "BaseClient",
    "Call",
    "SessionBase",
    "Verify",
    "max_retries_of_environment",
    "ws_error",
]

DEFAULT_URL = "http://127.0.0.1:8765"
DEFAULT_TIMEOUT = 60.0
# What a create's ``backend`` may name, for the CLI's and the MCP tools' help.
BACKEND_HELP = ("the engine: container, vm, docker, kubernetes or local (those the server "
                "offers; default: its own).")
#: Extra seconds an ``exec`` call waits beyond the command's own ``timeout_s``.
EXEC_GRACE_S = 15.0
#: Extra seconds an ``act`` call waits beyond the time its actions spend waiting or holding
#: keys on purpose: the server's timing of them is not exact.
ACT_GRACE_S = 15.0
#: The least a create waits for its session to run: longer than any engine's start (a VM
#: under software emulation paints its first page in 2-3 minutes). A client that gave up
#: sooner left the session it asked for running, unknown to it.
CREATE_WAIT_S = 600.0
#: The longest wait before trying a call again (``max_retries``), whatever Retry-After says.
MAX_RETRY_WAIT_S = 60.0

#: Set by the dialect endpoints on a settled screenshot: false if the wait for it timed out.
SETTLED_HEADER = "X-Deskbox-Settled"

Action = Mapping[str, Any]
ScreenshotOption = bool | Mapping[str, Any] | None
TokenScope = Literal["view", "control", "cdp"]


def path_segment(value: str) -> str:
    """An id or name as one segment of a URL path. Refused (ValueError) where it would not
    stay one: the server decodes %2F before routing, so ``"<id>/control"`` reached another
    route (a delete of the session handed its control back instead)."""
    if not value or "/" in value or value in (".", ".."):
        raise ValueError(f"not an id or name: {value!r}")
    return quote(value, safe="")


@dataclass(frozen=True)
class Call:
    """One HTTP request, described: what the sync and async clients send."""

    method: str
    path: str
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    content: bytes | None = None
    timeout: float | None = None
    expect_json: bool = True
    headers: dict[str, str] = field(default_factory=dict)
    #: Answer with the decoded body and the response's headers (:class:`Answer`).
    with_headers: bool = False


@dataclass(frozen=True)
class Answer:
    """A decoded body and the headers it came with (a :class:`Call` with ``with_headers``)."""

    body: Any
    headers: httpx.Headers


#: What a client trusts of a server behind TLS (``verify=``): True for httpx's default,
#: a CA bundle's path, an SSL context of the caller's, or False for no verification.
Verify = ssl.SSLContext | str | os.PathLike[str] | bool


def tls_context(verify: Verify) -> ssl.SSLContext:
    """One context for the client's HTTP calls and its websockets alike. True: httpx's
    default (certifi's authorities, or ``$SSL_CERT_FILE`` / ``$SSL_CERT_DIR`` when set),
    which the websockets would otherwise not share (they would use the system's store)."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if isinstance(verify, (str, os.PathLike)):
        return ssl.create_default_context(cafile=os.fspath(verify))
    return httpx.create_ssl_context(verify=verify)


class BaseClient:
    """Configuration and answer handling. Arguments win over ``DESKBOX_URL`` and
    ``DESKBOX_API_KEY``; the URL defaults to ``http://127.0.0.1:8765``."""

    def __init__(
        self, base_url: str | None, api_key: str | None, timeout: float, verify: Verify = True,
        max_retries: int | None = None,
    ) -> None:
        url = base_url or os.environ.get("DESKBOX_URL") or DEFAULT_URL
        self.base_url = url.rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("DESKBOX_API_KEY")
        self.timeout = timeout
        self.max_retries = _max_retries(max_retries)
        self._tls = tls_context(verify)

    def _retry_wait(self, error: APIError, tries: int) -> float | None:
        """How long to wait before sending a refused call again, or None to raise ``error``.

        Only a refusal for capacity (429, 503) is tried again: the server did nothing with
        the call, so sending it again is safe for any method. The wait is the answer's
        Retry-After, or 1, 2, 4 ... seconds without one. A full quota is not waited on:
        only a delete of the caller's frees it."""
        retryable = (isinstance(error, RateLimited | ServiceUnavailable)
                     and not isinstance(error, QuotaExceeded))
        if tries >= self.max_retries or not retryable:
            return None
        wait = error.retry_after if error.retry_after is not None else 2.0 ** tries
        return min(max(wait, 0.0), MAX_RETRY_WAIT_S)

    def _ws_options(self, url: str) -> dict[str, Any]:
        """What a websocket to ``url`` is opened with besides its headers: this client's
        TLS context for a ``wss://`` URL (a ``ws://`` one takes none)."""
        return {"ssl": self._tls} if url.startswith("wss://") else {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    @property
    def headers(self) -> dict[str, str]:
        headers = {"User-Agent": "deskbox-python"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _timeout_for(self, call: Call) -> float:
        return self.timeout if call.timeout is None else call.timeout

    @staticmethod
    def _read(call: Call, response: httpx.Response) -> Any:
        """The decoded answer (JSON, or bytes), or the :class:`APIError` of its status. Only
        a 2xx is an answer: a redirect (the client does not follow one) is an error too,
        else a DELETE answered 308 by a proxy read as done, the session left running."""
        if response.status_code >= 400:
            raise api_error(response)
        if not 200 <= response.status_code < 300:
            raise redirect_error(response)
        if not call.expect_json:
            body = response.content
        elif response.status_code == 204 or not response.content:
            body = None
        else:
            body = json_body(response)
        return Answer(body, response.headers) if call.with_headers else body


def max_retries_of_environment() -> int:
    """``$DESKBOX_MAX_RETRIES``, 0 when unset; ValueError when it is not a whole number
    of 0 or more."""
    value = os.environ.get("DESKBOX_MAX_RETRIES", "0")
    if not value.strip().isdigit():
        raise ValueError(f"DESKBOX_MAX_RETRIES must be a whole number of 0 or more, "
                         f"not {value!r}")
    return int(value)


def _max_retries(given: int | None) -> int:
    """``max_retries`` as given, else ``$DESKBOX_MAX_RETRIES``, else 0."""
    if given is None:
        return max_retries_of_environment()
    if given < 0:
        raise ValueError(f"max_retries must be 0 or more, not {given}")
    return given


def api_error(response: httpx.Response) -> APIError:
    """The exception of an error answer, read from the error body of API.md if it has one."""
    body: Any = None
    kind, message, request_id = "", "", response.headers.get("x-request-id")
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        kind = str(error.get("type") or "")
        message = str(error.get("message") or "")
        request_id = error.get("request_id") or request_id
    elif isinstance(body, dict) and "detail" in body:  # a route the server does not have
        message = str(body["detail"])
    retry_after: float | None = None
    if "retry-after" in response.headers:
        try:
            retry_after = float(response.headers["retry-after"])
        except ValueError:
            retry_after = None
    return error_for_status(
        response.status_code,
        kind or _kind_for(response.status_code),
        message or response.reason_phrase or "error",
        request_id,
        body,
        retry_after,
    )


def redirect_error(response: httpx.Response) -> APIError:
    """The exception of a 3xx: the API never redirects, so the URL reached something else
    (a proxy that moved it to https or under a path prefix)."""
    location = response.headers.get("location")
    where = f" to {location}" if location else ""
    return APIError(
        response.status_code, "redirect",
        f"the server redirected the call{where}: is the client's base URL the API's?",
        response.headers.get("x-request-id"), response.text,
    )


def json_body(response: httpx.Response) -> Any:
    """The answer's JSON; an :class:`APIError` for one that is not (a proxy's HTML page)."""
    try:
        return response.json()
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError alike
        kind = response.headers.get("content-type") or "no content type"
        raise APIError(
            response.status_code, "invalid_response",
            f"the answer is not JSON ({kind}): {error}",
            response.headers.get("x-request-id"), response.text,
        ) from error


def _kind_for(status: int) -> str:
    return {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
            409: "conflict", 413: "too_large", 422: "invalid_request", 429: "capacity"}.get(
        status, "internal" if status >= 500 else "bad_request")


def transport_error(
    error: httpx.TransportError | httpx.DecodingError | OSError | TimeoutError,
) -> APIConnectionError:
    # httpx's and asyncio's timeouts often carry no text: say which kind it was.
    detail = str(error) or type(error).__name__
    if isinstance(error, httpx.TimeoutException | TimeoutError):
        return APITimeoutError(f"no answer in time: {detail} (raise the client's timeout for "
                               "long calls)")
    if isinstance(error, httpx.DecodingError):  # e.g. a body not in its Content-Encoding
        return APIConnectionError(f"the server's answer could not be decoded: {detail}")
    return APIConnectionError(f"could not reach the Deskbox server: {detail}")


def ws_error(error: Mapping[str, Any]) -> APIError:
    """The exception of a websocket ``{"ok": false, "error": {...}}`` reply."""
    kind = str(error.get("type") or "internal")
    return error_for_status(
        _status_for_kind(kind), kind, str(error.get("message") or ""),
        error.get("request_id"), {"error": dict(error)},
    )


# -- actions ------------------------------------------------------------------------------


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def screenshot_option(screenshot: ScreenshotOption) -> dict[str, Any] | None:
    """``act(..., screenshot=True)`` → the API's ``{"format": "jpeg", "quality": 75}``."""
    if screenshot is None or screenshot is False:
        return None
    if screenshot is True:
        return {"format": "jpeg", "quality": 75}
    return dict(screenshot)


def screenshot_action(
    format: str,  # noqa: A002
    quality: int | None,
    region: Mapping[str, int] | None,
    scale: tuple[int, int] | None,
) -> dict[str, Any]:
    return _drop_none(
        type="screenshot", format=format, quality=quality,
        region=dict(region) if region else None,
        scale={"width": scale[0], "height": scale[1]} if scale else None,
    )


C = TypeVar("C", bound=BaseClient)


class SessionBase(Generic[C]):
    """What a session is and the calls it makes, without making them.

    ``Session`` and ``AsyncSession`` add one thin method per call. Attributes read the
    session as last described by the server; ``refresh()`` asks again.
    """

    def __init__(self, client: C, data: SessionData | Mapping[str, Any]) -> None:
        self._client = client
        self._data = data if isinstance(data, SessionData) else SessionData.from_json(data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state!r})"

    @property
    def data(self) -> SessionData:
        return self._data

    @property
    def id(self) -> str:
        return self._data.id

    @property
    def state(self) -> str:
        return self._data.state

    @property
    def urls(self) -> Any:
        return self._data.urls

    @property
    def display(self) -> Any:
        return self._data.display

    @property
    def labels(self) -> dict[str, str]:
        return self._data.labels

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{path_segment(self.id)}"

    def _update(self, body: Any) -> None:
        if isinstance(body, dict) and "id" in body and "state" in body:
            self._data = SessionData.from_json(body)

    # calls -----------------------------------------------------------------------------

    def _get_call(self, timeout: float | None) -> Call:
        return Call("GET", self._path, timeout=timeout)

    def _act_call(
        self,
        actions: Action | Sequence[Action],
        screenshot: ScreenshotOption,
        coordinate_space: tuple[int, int] | None,
        timeout: float | None,
    ) -> Call:
        body: dict[str, Any] = {"actions": action_list(actions)}
        if (shot := screenshot_option(screenshot)) is not None:
            body["screenshot"] = shot
        if coordinate_space is not None:
            body["coordinate_space"] = {
                "width": coordinate_space[0], "height": coordinate_space[1]
            }
        wait = timeout if timeout is not None else act_timeout(self._client.timeout,
                                                                  body["actions"])
        return Call("POST", f"{self._path}/actions", json=body, timeout=wait)

    def _anthropic_call(
        self, tool_input: Mapping[str, Any], coordinate_space: tuple[int, int] | None,
        format: str, quality: int | None, timeout: float | None,  # noqa: A002
    ) -> Call:
        wait = timeout if timeout is not None else _lengthened(
            self._client.timeout, anthropic_held_s(tool_input))
        return Call("POST", f"{self._path}/actions/anthropic", json=dict(tool_input),
                    params=dialect_params(coordinate_space, format, quality), timeout=wait,
                    with_headers=True)

    def _openai_call(
        self, action: Action | Sequence[Action], call_id: str | None,
        coordinate_space: tuple[int, int] | None, format: str,  # noqa: A002
        quality: int | None, timeout: float | None,
    ) -> Call:
        body = openai_body(action, call_id)
        waits = sum(isinstance(a, Mapping) and a.get("type") == "wait"
                    for a in openai_actions(body))
        wait = timeout if timeout is not None else _lengthened(
            self._client.timeout, waits * OPENAI_WAIT_S)
        return Call("POST", f"{self._path}/actions/openai", json=body,
                    params=dialect_params(coordinate_space, format, quality), timeout=wait,
                    with_headers=True)

    def _screenshot_call(
        self, format: str, quality: int | None, scale: tuple[int, int] | None,  # noqa: A002
        timeout: float | None,
    ) -> Call:
        params = [("format", format)]
        if quality is not None:
            params.append(("quality", str(quality)))
        if scale is not None:
            params.append(("scale", f"{scale[0]}x{scale[1]}"))
        return Call("GET", f"{self._path}/screenshot", params=params, timeout=timeout,
                    expect_json=False)

    def _handoff_call(self, reason: str, wait_s: float | None, timeout: float | None
                      ) -> Call:
        params = [("wait", "true"), ("timeout_s", f"{wait_s:g}")] if wait_s is not None else []
        wait = timeout if timeout is not None else (
            max(self._client.timeout, wait_s + EXEC_GRACE_S) if wait_s is not None else None)
        return Call("POST", f"{self._path}/handoff", params=params, json={"reason": reason},
                    timeout=wait)

    def _exec_call(
        self, cmd: str | Sequence[str], timeout_s: float, env: Mapping[str, str] | None,
        background: bool, timeout: float | None, secrets: Sequence[str] = (),
    ) -> Call:
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        body: dict[str, Any] = {"cmd": argv, "timeout_s": timeout_s, "env": dict(env or {}),
                                "background": background}
        if secrets:
            body["secrets"] = list(secrets)
        wait = timeout if timeout is not None else max(self._client.timeout,
                                                       timeout_s + EXEC_GRACE_S)
        return Call("POST", f"{self._path}/exec", json=body, timeout=wait)

    def _upload_call(self, path: str, data: bytes, timeout: float | None) -> Call:
        return Call("PUT", f"{self._path}/files", params=[("path", path)], content=data,
                    timeout=timeout)

    def _download_call(self, path: str, timeout: float | None) -> Call:
        return Call("GET", f"{self._path}/files", params=[("path", path)], timeout=timeout,
                    expect_json=False)

    def _recording_call(self, verb: Literal["start", "stop"], timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/recording/{verb}", timeout=timeout)

    def _trajectory_call(self, timeout: float | None) -> Call:
        return Call("GET", f"{self._path}/trajectory", timeout=timeout, expect_json=False)

    def _recording_file_call(self, name: Literal["recording.mp4", "trajectory.zip"],
                             timeout: float | None) -> Call:
        # Made by the server on request: it may encode the video for up to 600 s (then
        # answers 504), so the default wait outlasts that.
        return Call("GET", f"{self._path}/{name}", expect_json=False,
                    timeout=timeout if timeout is not None else max(self._client.timeout, 630))

    @staticmethod
    def _entries(data: bytes) -> list[dict[str, Any]]:
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def _pause_call(self, mode: str, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/pause", json={"mode": mode}, timeout=timeout)

    def _resume_call(self, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/resume", timeout=timeout)

    def _snapshot_call(self, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/snapshots", timeout=timeout)

    def _fork_call(self, count: int, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/fork", json={"count": count}, timeout=timeout)

    def _keepalive_call(self, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/keepalive", timeout=timeout)

    def _token_call(self, scope: TokenScope, ttl_s: int, timeout: float | None) -> Call:
        return Call("POST", f"{self._path}/tokens", json={"scope": scope, "ttl_s": ttl_s},
                    timeout=timeout)

    def _delete_call(self, timeout: float | None) -> Call:
        return Call("DELETE", self._path, timeout=timeout)

    # answers ---------------------------------------------------------------------------

    @staticmethod
    def _anthropic_result(answer: Answer) -> AnthropicResult:
        return AnthropicResult.from_json(answer.body, answer.headers.get(SETTLED_HEADER))

    @staticmethod
    def _openai_result(answer: Answer) -> OpenAIResult:
        return OpenAIResult.from_json(answer.body, answer.headers.get(SETTLED_HEADER))

    @staticmethod
    def _exec_result(body: Any) -> ExecResult:
        return ExecResult.from_json(body)

    @staticmethod
    def _upload_result(body: Any) -> Upload:
        return Upload(str(body["path"]), int(body["size"]))

    @staticmethod
    def _token(body: Any) -> Token:
        return Token(str(body["id"]), str(body["token"]), str(body["scope"]),
                     str(body["expires_at"]))

    @staticmethod
    def _snapshot(body: Any) -> Snapshot:
        return Snapshot(str(body["id"]), dict(body))

    @staticmethod
    def _forks(body: Any) -> list[dict[str, Any]]:
        items = body.get("sessions", []) if isinstance(body, dict) else body
        return [dict(item) for item in items]

    def _view_url(self, token: Token) -> str:
        return f"{self.urls.view}?token={quote(token.token, safe='')}"

    def _cdp_url(self, token: Token) -> str:
        return f"{self.urls.cdp_http}?token={quote(token.token, safe='')}"

    def _actions_ws_url(self) -> str:
        url: str = self.urls.actions_ws
        if not url:
            base = self._client.base_url
            url = "ws" + base.removeprefix("http") + f"{self._path}/actions/ws"
        return url


def dialect_params(
    coordinate_space: tuple[int, int] | None, format: str, quality: int | None,  # noqa: A002
) -> list[tuple[str, str]]:
    """The query of ``/actions/anthropic`` and ``/actions/openai``."""
    params = [("format", format)]
    if quality is not None:
        params.append(("quality", str(quality)))
    if coordinate_space is not None:
        params.append(("coordinate_space", f"{coordinate_space[0]}x{coordinate_space[1]}"))
    return params


def openai_body(action: Action | Sequence[Action], call_id: str | None) -> dict[str, Any]:
    """The body of ``/actions/openai``: one action (or a ``computer_call`` item, or
    ``{"action" | "actions", ...}``) as it is, a list as the batched ``actions``."""
    body = dict(action) if isinstance(action, Mapping) else {"actions": action_list(action)}
    if call_id is None:
        return body
    if "action" in body or "actions" in body:
        return {**body, "call_id": call_id}
    return {"call_id": call_id, "action": body}


def openai_actions(body: Mapping[str, Any]) -> list[Any]:
    """The actions of an ``/actions/openai`` body, in any of its shapes."""
    if isinstance(body.get("actions"), list):
        return list(body["actions"])
    if "action" in body:
        return [body["action"]]
    return [body]


#: What an OpenAI ``wait`` is on the server (its dialect's ``WAIT_MS``).
OPENAI_WAIT_S = 1.0


def anthropic_held_s(tool_input: Mapping[str, Any]) -> float:
    """The seconds an Anthropic tool input waits or holds keys on purpose: its
    ``duration``, a ``wait``'s 1 s by default."""
    kind, duration = tool_input.get("action"), tool_input.get("duration")
    if kind not in ("wait", "hold_key"):
        return 0.0
    if duration is None and kind == "wait":
        return 1.0
    return _seconds(duration)


def act_timeout(base: float, actions: Sequence[Action]) -> float:
    """How long to wait for the answer to ``actions`` when the caller set no timeout:
    ``base`` (the client's timeout) plus the time they wait or hold keys on purpose, which
    API.md lets add up to 60 s, the client's default timeout, before the settling even
    starts."""
    held = 0.0
    for action in actions:
        kind = action.get("type")
        if kind == "wait":
            held += _seconds(action.get("ms")) / 1000
        elif kind == "hold_key":
            held += _seconds(action.get("duration_s"))
    return _lengthened(base, held)


def _seconds(value: object) -> float:
    """A duration as given; one the server would refuse counts for nothing (it answers 422
    at once)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def _lengthened(base: float, held_s: float) -> float:
    return base + held_s + ACT_GRACE_S if held_s else base


def action_list(actions: Action | Sequence[Action]) -> list[dict[str, Any]]:
    if isinstance(actions, Mapping):
        return [dict(actions)]
    return [dict(a) for a in actions]


def click(x: int | None, y: int | None, button: str, count: int,
          modifiers: Sequence[str] | None) -> dict[str, Any]:
    return _drop_none(type="click", x=x, y=y, button=button, count=count,
                      modifiers=list(modifiers) if modifiers else None)


def move(x: int, y: int, modifiers: Sequence[str] | None) -> dict[str, Any]:
    return _drop_none(type="move", x=x, y=y, modifiers=list(modifiers) if modifiers else None)


def type_text(text: str) -> dict[str, Any]:
    return {"type": "type", "text": text}


def key(keys: str) -> dict[str, Any]:
    return {"type": "key", "keys": keys}


def scroll(x: int | None, y: int | None, dx: int, dy: int,
           modifiers: Sequence[str] | None) -> dict[str, Any]:
    return _drop_none(type="scroll", x=x, y=y, dx=dx, dy=dy,
                      modifiers=list(modifiers) if modifiers else None)


def drag(path: Sequence[tuple[int, int]], button: str,
         modifiers: Sequence[str] | None) -> dict[str, Any]:
    return _drop_none(type="drag", path=[[int(x), int(y)] for x, y in path], button=button,
                      modifiers=list(modifiers) if modifiers else None)


def ws_message(message_id: int, action: Action, screenshot: ScreenshotOption,
               coordinate_space: tuple[int, int] | None) -> str:
    message: dict[str, Any] = {"id": message_id, "action": dict(action)}
    if (shot := screenshot_option(screenshot)) is not None:
        message["screenshot"] = shot
    if coordinate_space is not None:
        message["coordinate_space"] = {"width": coordinate_space[0],
                                       "height": coordinate_space[1]}
    return json.dumps(message)


class OutOfStep(Exception):
    """A websocket reply that is not the one awaited: the socket can no longer be read."""


def ws_reply(text: str | bytes, sent_id: int) -> dict[str, Any]:
    """The JSON reply to the message ``sent_id``; OutOfStep for anything else (a frame's
    bytes, another message's reply)."""
    try:
        reply = json.loads(text)
    except ValueError:
        raise OutOfStep("a reply that is not JSON") from None
    if not isinstance(reply, dict) or reply.get("id") != sent_id:
        raise OutOfStep(f"a reply to another message than {sent_id}")
    return reply


def ws_result(
    reply: Mapping[str, Any], frames: list[bytes]
) -> tuple[dict[str, Any] | Screenshot, Screenshot | None, bool]:
    """One websocket reply and its binary frames → (the action's result, its screenshot,
    whether the screen had settled for it: false if the wait for it timed out)."""
    if not reply.get("ok"):
        raise ws_error(reply.get("error") or {})
    frames = list(frames)
    raw = reply.get("result") or {}
    result: dict[str, Any] | Screenshot = dict(raw)
    if "media_type" in raw and "size" in raw:
        result = Screenshot(frames.pop(0), raw["media_type"], raw["width"], raw["height"])
    shot = reply.get("screenshot")
    screenshot = None
    if shot:
        screenshot = Screenshot(frames.pop(0), shot["media_type"], shot["width"], shot["height"])
    return result, screenshot, bool(reply.get("settled", True))


def describe_cmd(cmd: str | Sequence[str]) -> str:
    return cmd if isinstance(cmd, str) else shlex.join(cmd)



# -- session collection calls -------------------------------------------------------------


def create_call(
    display: Mapping[str, int] | None, start_url: str | None, backend: str | None,
    from_snapshot: str | None, timeout_s: int | None, labels: Mapping[str, str] | None,
    resources: Mapping[str, Any] | None, network: Mapping[str, Any] | None,
    record: bool | None, coordinate_space: tuple[int, int] | None, wait: bool,
    timeout: float | None, volumes: Sequence[Mapping[str, Any]] | None = None,
    profile: str | None = None, idempotency_key: str | None = None,
) -> Call:
    browser = _drop_none(start_url=start_url, profile=profile)
    body = _drop_none(
        display=dict(display) if display else None,
        browser=browser or None,
        volumes=[dict(v) for v in volumes] if volumes else None,
        backend=backend, from_snapshot=from_snapshot, timeout_s=timeout_s,
        labels=dict(labels) if labels else None,
        resources=dict(resources) if resources else None,
        network=dict(network) if network else None, record=record,
        coordinate_space={"width": coordinate_space[0], "height": coordinate_space[1]}
        if coordinate_space else None,
    )
    params = [] if wait else [("wait", "false")]
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
    return Call("POST", "/v1/sessions", params=params, json=body, timeout=timeout,
                headers=headers)


def get_call(session_id: str, timeout: float | None) -> Call:
    return Call("GET", f"/v1/sessions/{path_segment(session_id)}", timeout=timeout)


LIST_PAGE = 1000  # the server's largest page


class SessionPages:
    """The requests of one ``sessions.list()``, apart from how they are sent: the pages of
    ``GET /v1/sessions`` (newest first) until the last, or until ``limit`` sessions."""

    def __init__(self, state: str | None, labels: Mapping[str, str] | None,
                 limit: int | None, timeout: float | None) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be 1 or more, not {limit}")
        self._params = [("state", state)] if state else []
        self._params += [("label", f"{k}:{v}") for k, v in (labels or {}).items()]
        self._limit, self._timeout = limit, timeout
        self._cursor: str | None = None
        self._done = False
        self.items: list[Mapping[str, Any]] = []

    def next_call(self) -> Call | None:
        """The next page's request; None once every session wanted is in ``items``."""
        if self._done:
            return None
        size = LIST_PAGE if self._limit is None else min(LIST_PAGE, self._limit - len(self.items))
        params = [*self._params, ("limit", str(size))]
        params += [("cursor", self._cursor)] if self._cursor else []
        return Call("GET", "/v1/sessions", params=params, timeout=self._timeout)

    def take(self, body: Mapping[str, Any]) -> None:
        """The answer to :meth:`next_call`."""
        self.items += body["sessions"]
        self._cursor = body.get("next_cursor")
        self._done = not self._cursor or (
            self._limit is not None and len(self.items) >= self._limit)


def delete_call(session_id: str, timeout: float | None) -> Call:
    return Call("DELETE", f"/v1/sessions/{path_segment(session_id)}", timeout=timeout)


def snapshot_get_call(snapshot_id: str, timeout: float | None) -> Call:
    return Call("GET", f"/v1/snapshots/{path_segment(snapshot_id)}", timeout=timeout)


def snapshot_list_call(timeout: float | None) -> Call:
    return Call("GET", "/v1/snapshots", timeout=timeout)


def snapshot_delete_call(snapshot_id: str, timeout: float | None) -> Call:
    return Call("DELETE", f"/v1/snapshots/{path_segment(snapshot_id)}", timeout=timeout)


def snapshot_pool_call(snapshot_id: str, size: int, timeout: float | None) -> Call:
    return Call("PUT", f"/v1/snapshots/{path_segment(snapshot_id)}/pool",
                json={"size": size}, timeout=timeout)


def secret_create_call(name: str, value: str, allowed_origins: Sequence[str],
                       timeout: float | None) -> Call:
    return Call("POST", "/v1/secrets", json={
        "name": name, "value": value, "allowed_origins": list(allowed_origins)},
        timeout=timeout)


def secret_list_call(timeout: float | None) -> Call:
    return Call("GET", "/v1/secrets", timeout=timeout)


def secret_delete_call(name: str, timeout: float | None) -> Call:
    return Call("DELETE", f"/v1/secrets/{path_segment(name)}", timeout=timeout)


def volume_create_call(name: str, size_mb: int, timeout: float | None) -> Call:
    return Call("POST", "/v1/volumes", json={"name": name, "size_mb": size_mb},
                timeout=timeout)


def volume_get_call(name: str, timeout: float | None) -> Call:
    return Call("GET", f"/v1/volumes/{path_segment(name)}", timeout=timeout)


def volume_list_call(timeout: float | None) -> Call:
    return Call("GET", "/v1/volumes", timeout=timeout)


def volume_delete_call(name: str, timeout: float | None) -> Call:
    return Call("DELETE", f"/v1/volumes/{path_segment(name)}", timeout=timeout)


def volume_of(body: Any) -> Volume:
    return Volume(str(body["name"]), dict(body))


def snapshots_of(body: Any) -> list[Snapshot]:
    return [Snapshot(str(item["id"]), dict(item)) for item in body["snapshots"]]


def handshake_error(status: int, headers: Sequence[tuple[str, str]], body: bytes) -> APIError:
    """The exception of a refused websocket handshake (its answer has the error body)."""
    return api_error(httpx.Response(status, headers=list(headers), content=body))
