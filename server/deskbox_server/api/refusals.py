"""Action calls refused for their input, kept by the session's recording as sent.

A recording has every call of the agent's, refused ones included (API.md "Recordings and
trajectories"). The desktop's refusals (a point off the screen) are recorded with the
batch; these are the ones that come before there is a batch: FastAPI's validation of a
body (a negative point, a fourth click), a websocket message the schema refuses, a vendor
call that translates to no actions of the API. The call is answered as it would be.
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
    "RecordsDialectRefusals", "RecordsRefusals", "record_owners_refused", "record_refused",
    "sent_actions",
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
                session_id = request.path_params.get("session_id")
                if isinstance(session_id, str) and error.body is not None:
                    refusal = InvalidRequest(validation_message(error.errors()))
                    record_refused(request, session_id, error.body, self.sent(error.body),
                                   refusal, self.dialect)
                raise

        return recorded


class RecordsDialectRefusals(RecordsRefusals):
    """A vendor dialect's route: what was sent is the vendor's tool input, kept whole and
    named by its dialect (the route's last path segment, ``anthropic`` or ``openai``)."""

    def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.dialect = path.rsplit("/", 1)[-1]

    def sent(self, body: object) -> list[dict[str, object]] | None:
        return None
