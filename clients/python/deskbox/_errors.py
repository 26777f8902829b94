"""Errors the SDK raises. Every one of them is a :class:`DeskboxError`::

    DeskboxError                      anything this SDK raises
    ├── APIConnectionError            the server could not be reached (or the socket broke)
    │   └── APITimeoutError           no answer within the call's timeout
    └── APIError                      the server answered with an error body (API.md),
        │                             or a redirect (``redirect``: 3xx, the API has none)
        │                             or a body that is not JSON (``invalid_response``)
        ├── BadRequest                400
        ├── Unauthorized              401  missing or wrong API key / token
        ├── Forbidden                 403  (``secret_origin_mismatch`` too)
        ├── NotFound                  404  unknown session, or a route this server lacks
        ├── MethodNotAllowed          405  a route this server lacks for this method
        ├── Conflict                  409  e.g. a paused session; ``human_in_control``
        ├── PayloadTooLarge           413  an upload over the server's cap
        ├── UnprocessableEntity       422  invalid request (``invalid_request``)
        ├── RateLimited               429  ``capacity``; ``retry_after`` in seconds
        │   └── QuotaExceeded         429  ``quota_exceeded``: only a delete frees it
        └── ServerError               5xx
            ├── SessionFailed         502  the session's desktop failed
            ├── ServiceUnavailable    503  ``capacity``; ``retry_after`` in seconds
            └── GatewayTimeout        504  ``timeout``

An :class:`APIError` carries ``status``, ``type`` (the error body's kind), ``message``,
``request_id``, ``action_index`` (in a batch of actions, the one that failed: those before it
were done, those after it not; else None) and the decoded ``body``. Errors reported over
the actions websocket have no HTTP status of their own; they are mapped by kind to the
status the HTTP API would use.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "BadRequest",
    "Conflict",
    "DeskboxError",
    "Forbidden",
    "GatewayTimeout",
    "InsufficientStorage",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "RequestTimeout",
    "ServerError",
    "ServiceUnavailable",
    "SessionFailed",
    "Unauthorized",
    "UnprocessableEntity",
    "error_for_status",
    "status_for_kind",
]


class DeskboxError(Exception):
    """Root of every error the Deskbox SDK raises."""


class APIConnectionError(DeskboxError):
    """The request did not get an answer: connection refused, reset, or a broken socket."""


class APITimeoutError(APIConnectionError):
    """No answer within the timeout of the call (or of the client)."""


class APIError(DeskboxError):
    """The server answered with an error status and (usually) the error body of API.md."""

    def __init__(
        self,
        status: int,
        type: str,  # noqa: A002 (the error body's name)
        message: str,
        request_id: str | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {type}: {message}" + (f" [{request_id}]" if request_id else ""))
        self.status = status
        self.type = type
        self.message = message
        self.request_id = request_id
        self.body = body
        self.retry_after = retry_after
        self.action_index = _action_index(body)


class BadRequest(APIError):
    """400."""


class Unauthorized(APIError):
    """401: a missing or wrong API key or token."""


class Forbidden(APIError):
    """403."""


class NotFound(APIError):
    """404: an unknown session, snapshot or path (or a route this server does not have)."""


class MethodNotAllowed(APIError):
    """405: a route this server does not have for this method."""


class RequestTimeout(APIError):
    """408: the request's body stopped arriving; the server gave up reading it."""


class Conflict(APIError):
    """409: the session is in the wrong state (starting, paused, ...)."""


class PayloadTooLarge(APIError):
    """413: an upload over the server's size cap."""


class UnprocessableEntity(APIError):
    """422: the request is invalid (``invalid_request``)."""


class RateLimited(APIError):
    """429: out of capacity; ``retry_after`` says when to try again (seconds) if known."""


class QuotaExceeded(RateLimited):
    """429 ``quota_exceeded``: the key's snapshots, volumes, recordings or secrets fill its
    quota. Waiting frees nothing (no ``retry_after``): delete some first."""


class ServerError(APIError):
    """5xx."""


class SessionFailed(ServerError):
    """502: the session's desktop failed."""


class ServiceUnavailable(ServerError):
    """503: out of capacity; ``retry_after`` says when to try again (seconds) if known."""


class GatewayTimeout(ServerError):
    """504: the server gave up waiting (``timeout``)."""


class InsufficientStorage(ServerError):
    """507: no room on the server's disk to keep a checkpoint; the session is as it was."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    408: RequestTimeout,
    409: Conflict,
    413: PayloadTooLarge,
    422: UnprocessableEntity,
    429: RateLimited,
    502: SessionFailed,
    503: ServiceUnavailable,
    504: GatewayTimeout,
    507: InsufficientStorage,
}

# Every kind of API.md's table of errors, with the status its HTTP answer has.
_STATUS_BY_KIND: dict[str, int] = {
    "unauthorized": 401,
    "forbidden": 403,
    "secret_origin_mismatch": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "human_in_control": 409,
    "invalid_request": 422,
    "capacity": 429,
    "quota_exceeded": 429,
    "session_failed": 502,
    "timeout": 504,
    "insufficient_storage": 507,
    "internal": 500,
}


def status_for_kind(kind: str) -> int:
    """The HTTP status the API uses for an error ``kind`` (500 if unknown)."""
    return _STATUS_BY_KIND.get(kind, 500)


def error_for_status(
    status: int,
    type: str,  # noqa: A002
    message: str,
    request_id: str | None = None,
    body: Any = None,
    retry_after: float | None = None,
) -> APIError:
    """The exception of ``status`` (its class, else ServerError for 5xx, else APIError)."""
    cls = QuotaExceeded if type == "quota_exceeded" else _BY_STATUS.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else APIError
    return cls(status, type, message, request_id, body, retry_after)


def _action_index(body: Any) -> int | None:
    error = body.get("error") if isinstance(body, dict) else None
    index = error.get("action_index") if isinstance(error, dict) else None
    return index if type(index) is int else None
