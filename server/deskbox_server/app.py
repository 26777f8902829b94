"""``create_app(settings)``: wires the server together. Nothing is built at import."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI

from . import __version__
from .api import actions, health, sessions
from .api.auth import load_keyring
from .api.deps import Services
from .api.errors import RequestContext, install_error_handlers
from .backends.base import Backend
from .backends.local import LocalBackend
from .metrics import Metrics
from .sessions.manager import SessionManager
from .sessions.registry import Registry
from .settings import Settings

__all__ = ["create_app", "default_backends"]

log = logging.getLogger("deskbox.server")


def default_backends(settings: Settings) -> dict[str, Backend]:
    """The backends this server offers. The container backend joins here when it lands."""
    return {LocalBackend.name: LocalBackend()}


def create_app(
    settings: Settings | None = None, backends: Mapping[str, Backend] | None = None
) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()
    manager = SessionManager(
        settings,
        Registry(settings.database_path),
        backends if backends is not None else default_backends(settings),
        metrics,
    )
    services = Services(settings, load_keyring(settings), manager, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        log.info("deskbox serving; state in %s", settings.state_dir)
        try:
            yield
        finally:
            await manager.shutdown()
            log.info("deskbox stopped every session")

    app = FastAPI(
        title="Deskbox",
        version=__version__,
        summary="Disposable desktops for computer-use agents",
        lifespan=lifespan,
    )
    app.state.services = services
    count = metrics.errors.inc
    install_error_handlers(app, count)
    app.add_middleware(RequestContext, max_body_bytes=settings.max_request_bytes, count=count)
    app.include_router(health.router)
    app.include_router(sessions.router)
    app.include_router(actions.router)
    return app
