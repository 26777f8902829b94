"""Secrets on the wire (API.md "Secrets"): ``/v1/secrets``, a ``type`` action's ``secret``
and an ``exec``'s ``secrets``. A value goes in once and never comes out."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["MAX_SECRET_BYTES", "Secret", "SecretCreate", "SecretList", "SecretName",
           "normal_origin"]

MAX_SECRET_BYTES = 4096
# Usable as an environment variable's name (exec's "secrets") and in {{secret:NAME}}.
SecretName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]


def normal_origin(value: str) -> str:
    """``scheme://host[:port]``, lowercased, without a default port; ValueError otherwise."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) origin such as https://github.com")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{value!r} is an origin with a path, query or user: give only "
                         "scheme://host[:port]")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} has a bad port") from None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


Origin = Annotated[str, Field(max_length=300), AfterValidator(normal_origin)]


class SecretCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    name: SecretName
    value: Annotated[str, Field(min_length=1, max_length=MAX_SECRET_BYTES, repr=False)]
    allowed_origins: Annotated[list[Origin], Field(min_length=1, max_length=32)]


class Secret(BaseModel):
    """What is known of a secret: never its value."""

    name: str
    allowed_origins: list[str]
    created_at: datetime


class SecretList(BaseModel):
    secrets: list[Secret]
