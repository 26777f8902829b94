"""What routers need from the app (wired by ``create_app``), as FastAPI dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from ..metrics import Metrics
from ..sessions.manager import SessionManager
from ..settings import Settings
from .auth import KeyRing, Principal, authenticate

__all__ = ["Caller", "Services", "get_services", "require_key"]


@dataclass(frozen=True)
class Services:
    settings: Settings
    keyring: KeyRing
    manager: SessionManager
    metrics: Metrics


def get_services(connection: HTTPConnection) -> Services:
    services = connection.app.state.services
    assert isinstance(services, Services)
    return services


def require_key(request: Request) -> Principal:
    return authenticate(get_services(request).keyring, request)


Caller = Annotated[Principal, Depends(require_key)]
