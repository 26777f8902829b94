"""``GET /healthz`` (no auth) and ``GET /metrics`` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from ..schemas.health import Health
from .deps import get_services

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz(request: Request) -> Health:
    manager = get_services(request).manager
    counts = manager.counts_by_state()
    live = sum(counts[s] for s in ("starting", "running", "paused", "hibernated", "stopping"))
    problems = await manager.problems()
    return Health(status="degraded" if problems else "ok", problems=problems, sessions=live,
                  engines=manager.describe_engines())


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain; version=0.0.4": {}}}},
)
async def metrics(request: Request) -> PlainTextResponse:
    services = get_services(request)
    pool = services.manager.pool
    text = services.metrics.render(
        services.manager.counts_by_state(), pool.ready_by_display() if pool else None
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")
