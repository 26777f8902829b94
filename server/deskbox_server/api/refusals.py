"""Action calls refused for their input, kept by the session's recording as sent.

A recording has every call of the agent's, refused ones included (API.md "Recordings and
trajectories"). The desktop's refusals (a point off the screen) are recorded with the
batch; these are the ones that come before there is a batch: FastAPI's validation of a
body (a negative point, a fourth click) or of ``GET /screenshot``'s query (a format it
does not make), a websocket message the schema refuses, a vendor call that translates to
no actions of the API. The call is answered as it would be.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from ..errors import DeskboxError, InvalidRequest
from ..schemas.batch import MAX_BATCH, REQUEST_KEYS
from .auth import authenticate
from .deps import Services, get_services
from .errors import validation_message

__all__ = [
    "RecordsDialectRefusals", "RecordsQueryRefusals", "RecordsRefusals",
    "record_owners_refused", "record_refused", "record_refused_query", "sent_actions",
]


def sent_actions(body: object) -> list[dict[str, object]] | None:
    """The actions a refused ``POST /actions`` body sent, if each reads as one (an object
    with a ``type``: the batch or the single action, without the request's own keys)."""
    if not isinstance(body, dict):
        return None
    listed: object = body.get("actions")
    if "actions" not in body and "type" in body:
        listed = [{k: v for k, v in body.items() if k not in REQUEST_KEYS}]
    if not isinstance(listed, list) or not 0 < len(listed) <= MAX_BATCH:
        return None
    if all(isinstance(x, dict) and isinstance(x.get("type"), str) for x in listed):
        return listed
    return None


def record_refused(
    request: Request, session_id: str, sent: object, actions: list[dict[str, object]] | None,
    error: DeskboxError, dialect: str | None = None,
) -> None:
    """Keep the refused call in the session's recording, if it records; the caller still
    answers the error (a key or session that is wrong is theirs to say)."""
    services = get_services(request)
    try:
        owner = authenticate(services.keyring, request).key_id
    except DeskboxError:
        return
    record_owners_refused(services, owner, session_id, sent, actions, error, dialect)


def record_owners_refused(
    services: Services, owner: str, session_id: str, sent: object,
    actions: list[dict[str, object]] | None, error: DeskboxError, dialect: str | None = None,
) -> None:
    """:func:`record_refused` of a call whose key is known (``owner``). Only JSON is kept:
    a body that is not JSON was no call."""
    if not isinstance(sent, dict | list):
        return
    try:
        session = services.manager.held(owner, session_id)
    except DeskboxError:
        return
    session.refused(sent, actions, error, dialect)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class RecordsRefusals(APIRoute):
    """A route of ``POST /actions``'s kind: a body FastAPI refuses is recorded, as the
    actions it sent where it reads as actions."""

    dialect: str | None = None

    def sent(self, body: object) -> list[dict[str, object]] | None:
        return sent_actions(body)

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def recorded(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as error:
                self.record(request, error)
                raise

        return recorded

    def record(self, request: Request, error: RequestValidationError) -> None:
        """Keep the refused body (a GET has none: RecordsQueryRefusals keeps its query)."""
        session_id = request.path_params.get("session_id")
        if isinstance(session_id, str) and error.body is not None:
            refusal = InvalidRequest(validation_message(error.errors()))
            record_refused(request, session_id, error.body, self.sent(error.body), refusal,
                           self.dialect)


class RecordsDialectRefusals(RecordsRefusals):
    """A vendor dialect's route: what was sent is the vendor's tool input, kept whole and
    named by its dialect (the route's last path segment, ``anthropic`` or ``openai``)."""

    def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.dialect = path.rsplit("/", 1)[-1]

    def sent(self, body: object) -> list[dict[str, object]] | None:
        return None


class RecordsQueryRefusals(RecordsRefusals):
    """A ``GET`` route that runs an action (``GET /screenshot``, named by the route's last
    path segment): a query FastAPI refuses is kept as that action, as sent (a GET has no
    body to keep)."""

    def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.action = path.rsplit("/", 1)[-1]

    def record(self, request: Request, error: RequestValidationError) -> None:
        record_refused_query(request, InvalidRequest(validation_message(error.errors())))

    def sent_query(self, request: Request) -> dict[str, object]:
        """The action with the query's parameters of this route the request set, as their
        strings (a query has no types); any other parameter is left out, as the call
        leaves it unread."""
        sent: dict[str, object] = {"type": self.action}
        for param in self.dependant.query_params:
            value = request.query_params.get(param.alias)
            if value is not None:  # the last of a repeated one, as FastAPI reads it
                sent[param.alias] = value
        return sent


def record_refused_query(request: Request, error: DeskboxError) -> None:
    """Keep a call of a :class:`RecordsQueryRefusals` route refused for its query, by FastAPI
    or by the route itself (a ``scale`` of no size), as the action it asked for."""
    route = request.scope.get("route")
    session_id = request.path_params.get("session_id")
    if isinstance(route, RecordsQueryRefusals) and isinstance(session_id, str):
        sent = route.sent_query(request)
        record_refused(request, session_id, sent, [sent], error)
