"""Human handoff (API.md "Human handoff"): ``POST/DELETE /v1/sessions/{id}/control`` (a
human takes the session over from its live view with a control token, and hands it back),
``POST/GET /v1/sessions/{id}/handoff`` (the agent asks for help, and may wait for it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from ..schemas.handoff import ControlRequest, Handoff, HelpRequest
from .deps import Caller, get_services
from .disconnect import unless_client_leaves
from .tokens import authorize

__all__ = ["router"]

# "live view": the control routes take session tokens as the view's other routes do.
router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["live view"])
MAX_WAIT_S = 600.0


@router.post("/control", response_model=Handoff)
async def take_control(
    request: Request, session_id: str, body: ControlRequest | None = None
) -> Handoff:
    """Take control (a control token, or the owner's key): the API's actions answer 409
    ``human_in_control`` until the hand-back or the end of ``lease_s``. Another token's
    take meanwhile is a 409 too; the holder's renews its lease."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, "control")
    session = await services.manager.session(grant.owner, session_id)
    holder = grant.token_id or f"key:{grant.owner}"
    return session.take_control((body or ControlRequest()).lease_s, holder)


@router.delete("/control", response_model=Handoff)
async def hand_back(request: Request, session_id: str) -> Handoff:
    """Hand the session back to its agent."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, "control")
    return (await services.manager.session(grant.owner, session_id, "live")).hand_back()


@router.get("/handoff", response_model=Handoff)
async def handoff_state(request: Request, session_id: str) -> Handoff:
    """Who drives the session, and whether its agent asked for help (view or control
    token, or the owner's key)."""
    services = get_services(request)
    grant = await authorize(services, request, session_id, ("view", "control"))
    session = await services.manager.session(grant.owner, session_id, "live")
    return session.handoff.resource()


@router.post("/handoff", response_model=Handoff)
async def ask_for_help(
    request: Request, caller: Caller, session_id: str, body: HelpRequest,
    wait: Annotated[bool, Query(description="answer once a human took control and "
                                            "handed back")] = False,
    timeout_s: Annotated[float, Query(gt=0, le=MAX_WAIT_S)] = 60.0,
) -> Handoff:
    """The agent asks for a human: an event, and the session marked as needing help."""
    session = await get_services(request).manager.session(caller.key_id, session_id)
    # A wait whose client left would stay parked for up to MAX_WAIT_S, a request for nobody.
    return await unless_client_leaves(
        request, session.ask_for_help(body.reason, timeout_s if wait else None))
