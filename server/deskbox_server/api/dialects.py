"""Vendor dialects of ``POST /actions``: ``/actions/anthropic`` and ``/actions/openai``.

The body is the vendor's tool input; the answer is what the vendor expects back (see
``dialects/``). Both take the same query options:

- ``coordinate_space=WxH``: coordinates in and images out are in that space (default: the
  session's ``coordinate_space``, else screen pixels) — the display size given to the model,
- ``format`` (``png`` by default, ``jpeg``, ``webp``) and ``quality`` of the images.

Answers that are a settled screenshot carry ``X-Deskbox-Settled: true|false`` (false when
the screen was still changing when the wait for it to settle timed out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Literal, TypeVar

from fastapi import APIRouter, Body, Query, Request, Response
from pydantic import ValidationError

from ..dialects import anthropic, openai
from ..dialects.plan import Plan, check_call
from ..errors import Internal, InvalidRequest
from ..media import EncodedImage
from ..schemas import actions as a
from ..schemas.results import Point
from ..sessions.session import Session
from .actions import SIZE_PATTERN, parse_size
from .deps import Caller, get_services
from .errors import validation_message
from .refusals import RecordsDialectRefusals, record_refused
from .replies import encodes_on_loop, json_on_thread

__all__ = ["router"]

router = APIRouter(prefix="/v1/sessions/{session_id}/actions", tags=["actions"],
                   route_class=RecordsDialectRefusals)

SpaceQuery = Annotated[
    str | None,
    Query(description="WIDTHxHEIGHT: the coordinate space of the model (the display size "
                      "it was told); default: the session's",
          json_schema_extra={"pattern": SIZE_PATTERN}),
]
FormatQuery = Annotated[Literal["png", "jpeg", "webp"], Query(description="image format")]
QualityQuery = Annotated[int, Query(ge=1, le=100, description="jpeg/webp quality")]
SETTLED_HEADER = "X-Deskbox-Settled"


def _view(value: str | None) -> a.CoordinateSpace | None:
    if value is None:
        return None
    width, height = parse_size(value, "coordinate_space")
    try:
        return a.CoordinateSpace(width=width, height=height)
    except ValidationError as error:
        raise InvalidRequest(validation_message(error.errors())) from None


def _settled(response: Response) -> dict[str, str]:
    """The header ``_answer`` set on FastAPI's response, for a reply made as a Response of
    its own (FastAPI passes that one on as it is)."""
    value = response.headers.get(SETTLED_HEADER)
    return {SETTLED_HEADER: value} if value is not None else {}


async def _session(request: Request, caller: Caller, session_id: str) -> Session:
    return await get_services(request).manager.session(caller.key_id, session_id)


def _space(session: Session, view: a.CoordinateSpace | None) -> tuple[int, int]:
    """The size of the space the model's coordinates are in: the request's, the session's,
    else the screen's."""
    body = session.record.body
    space = view or body.coordinate_space or body.display
    return space.width, space.height


T = TypeVar("T")


async def _translated(
    request: Request, session_id: str, dialect: str, translate: Callable[[], T]
) -> T:
    """``translate()``; a call it refuses (a value past our actions' bounds, a bad
    ``coordinate_space``) is kept in the session's recording as sent (refusals.py)."""
    try:
        return translate()
    except InvalidRequest as error:
        record_refused(request, session_id, await request.json(), None, error, dialect)
        raise


async def _answer(
    response: Response,
    session: Session,
    plan: Plan,
    view: a.CoordinateSpace | None,
) -> EncodedImage | Point:
    """Run the plan through the session's worker, as ``POST /actions`` does."""
    batch = await session.act(plan.actions, view, plan.screenshot, check=lambda: check_call(
        plan.actions, *_space(session, view)))
    if plan.screenshot is not None and batch.screenshot is not None:
        response.headers[SETTLED_HEADER] = "true" if batch.settled else "false"
        return batch.screenshot
    last = batch.results[-1] if batch.results else None
    if isinstance(last, EncodedImage | Point):
        return last
    raise Internal("the desktop answered without the image the action asked for")


@router.post(
    "/anthropic",
    response_model=list[anthropic.ContentBlock],
    summary="Run one input of Anthropic's computer tool; answer with tool_result content",
)
async def run_anthropic(
    request: Request,
    response: Response,
    caller: Caller,
    session_id: str,
    tool_input: Annotated[anthropic.ComputerInput, Body()],
    coordinate_space: SpaceQuery = None,
    format: FormatQuery = "png",  # noqa: A002 (the API's name)
    quality: QualityQuery = 75,
) -> list[anthropic.TextBlock | anthropic.ImageBlock] | Response:
    """The ``input`` of a ``computer`` tool_use block (computer_20250124 / 20251124)."""
    view, plan = await _translated(request, session_id, "anthropic", lambda: (
        _view(coordinate_space),
        anthropic.to_plan(tool_input, a.Screenshot(format=format, quality=quality))))
    answer = await _answer(response, await _session(request, caller, session_id), plan, view)
    if isinstance(answer, Point) or encodes_on_loop([answer]):
        return anthropic.render(answer)
    return await json_on_thread(lambda: anthropic.render(answer), exclude_none=False,
                                headers=_settled(response))


@router.post(
    "/openai",
    response_model=openai.ComputerCallOutput,
    response_model_exclude_none=True,
    summary="Run an OpenAI computer_call action; answer with its computer_call_output",
)
async def run_openai(
    request: Request,
    response: Response,
    caller: Caller,
    session_id: str,
    call: Annotated[openai.ComputerCall, Body()],
    coordinate_space: SpaceQuery = None,
    format: FormatQuery = "png",  # noqa: A002 (the API's name)
    quality: QualityQuery = 75,
) -> openai.ComputerCallOutput | Response:
    """The ``action`` of a ``computer_call``, or ``{"call_id", "action" | "actions"}``."""
    view = await _translated(request, session_id, "openai", lambda: _view(coordinate_space))
    session = await _session(request, caller, session_id)
    width, height = _space(session, view)
    screen = session.record.body.display
    plan = await _translated(request, session_id, "openai", lambda: openai.to_plan(
        call, a.Screenshot(format=format, quality=quality),
        (screen.width / width, screen.height / height)))
    answer = await _answer(response, session, plan, view)
    if not isinstance(answer, EncodedImage):
        raise Internal("the desktop answered without a screenshot")
    if encodes_on_loop([answer]):
        return openai.render(answer, call.call_id)
    return await json_on_thread(lambda: openai.render(answer, call.call_id), exclude_none=True,
                                headers=_settled(response))
