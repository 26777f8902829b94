"""Wire models of sessions (API.md "Sessions"): the create body and the Session resource."""

from __future__ import annotations

import contextlib
import ipaddress
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .actions import CoordinateSpace
from .scalars import Bool, IntOnly, NumberOnly
from .volumes import MAX_VOLUMES, PROFILE_PATH, VolumeMount, VolumeName

__all__ = [
    "MAX_LABELS",
    "MAX_START_URL",
    "MIN_CPUS",
    "MIN_PIDS",
    "Browser",
    "Display",
    "Failure",
    "Network",
    "Resources",
    "Session",
    "SessionCreate",
    "SessionList",
    "SessionState",
    "SessionUrls",
    "is_host_name_or_ip",
]

MAX_START_URL = 64 * 1024
START_URL_SCHEMES = ("http://", "https://", "file://", "data:", "about:")
Label = Annotated[str, Field(min_length=1, max_length=128)]
MAX_LABELS = 64  # a session's
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class SessionState(StrEnum):
    starting = "starting"
    running = "running"
    paused = "paused"
    hibernated = "hibernated"
    stopping = "stopping"
    stopped = "stopped"
    failed = "failed"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Display(_Body):
    width: Annotated[int, Field(ge=64, le=7680), IntOnly] = 1280
    height: Annotated[int, Field(ge=64, le=4320), IntOnly] = 800
    dpi: Annotated[int, Field(ge=24, le=600), IntOnly] = 96


class Browser(_Body):
    start_url: Annotated[str, Field(min_length=1, max_length=MAX_START_URL)] = "about:blank"
    # A volume of this name holds the browser's profile (made on first use): cookies,
    # logins and storage outlive the session.
    profile: VolumeName | None = None

    @field_validator("start_url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if not url.lower().startswith(START_URL_SCHEMES):
            raise ValueError("start_url must be an http, https, file, data or about: URL")
        return url


# A desktop (init, Xvfb, openbox, Chromium, the agent) holds 66-83 processes and threads
# once started, on about:blank or a page (measured on runc); below ~72 its start fails.
# The floor leaves room for the agent's calls, a live view and a hibernation's restore.
MIN_PIDS = 128
# A CFS quota is 1 ms per 100 ms period at least: runc rounded less up to 0.01, and Docker
# refused it (a 502). An engine may need more (Engine.least_cpus).
MIN_CPUS = 0.01


class Resources(_Body):
    cpus: Annotated[float, Field(ge=MIN_CPUS, le=64), NumberOnly] = 1.0
    memory_mb: Annotated[int, Field(ge=256, le=262_144), IntOnly] = 2048
    pids: Annotated[int, Field(ge=MIN_PIDS, le=65_536), IntOnly] = 1024


def is_host_name_or_ip(entry: str) -> bool:
    """An IPv4/IPv6 address, or a DNS host name (RFC 1123 labels, no wildcard)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(entry)
        return True
    name = entry[:-1] if entry.endswith(".") else entry
    labels = name.split(".")
    return (0 < len(name) <= 253 and all(_HOST_LABEL.match(label) for label in labels)
            and not labels[-1].isdigit())  # 1.2.3 or 300.1.1.1: a bad IP, not a name


class Network(_Body):
    egress: Literal["none", "allowlist", "all"] = "none"
    allow: Annotated[list[Annotated[str, Field(min_length=1, max_length=253)]],
                     Field(max_length=256)] = []

    @field_validator("allow")
    @classmethod
    def _hosts_or_ips(cls, allow: list[str]) -> list[str]:
        for entry in allow:
            if not is_host_name_or_ip(entry):
                raise ValueError(f"{entry!r} is not a host name or an IP address")
        return allow

    @model_validator(mode="after")
    def _allow_needs_allowlist(self) -> Network:
        if self.allow and self.egress != "allowlist":
            raise ValueError("allow needs egress 'allowlist'")
        return self


class SessionCreate(_Body):
    """Every field is optional; unknown fields are refused (422)."""

    display: Display = Display()
    browser: Browser = Browser()
    backend: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    from_snapshot: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    timeout_s: Annotated[int, Field(ge=1), IntOnly] | None = None
    labels: Annotated[dict[Label, Annotated[str, Field(max_length=256)]],
                      Field(max_length=MAX_LABELS)] = {}
    resources: Resources | None = None
    network: Network | None = None
    record: Bool = False
    coordinate_space: CoordinateSpace | None = None
    # The kubernetes backend's RuntimeClass for this session's pod (gvisor, kata); other
    # backends refuse it.
    runtime_class: Annotated[str, Field(
        min_length=1, max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")] | None = None
    volumes: Annotated[list[VolumeMount], Field(max_length=MAX_VOLUMES)] = []

    @model_validator(mode="after")
    def _volumes_apart(self) -> SessionCreate:
        mounts = self.all_volumes()
        names = [m.name for m in mounts]
        if len(set(names)) != len(names):
            raise ValueError("a volume may be mounted once per session (browser.profile "
                             "counts as a mount)")
        paths = sorted(m.path for m in mounts)
        for outer, inner in zip(paths, paths[1:], strict=False):
            if inner == outer or inner.startswith(outer + "/"):
                raise ValueError(f"volume paths {outer} and {inner} overlap"
                                 + (" (browser.profile is mounted at " + PROFILE_PATH + ")"
                                    if PROFILE_PATH in (outer, inner) else ""))
        return self

    def all_volumes(self) -> list[VolumeMount]:
        """``volumes`` and the browser's profile volume, if any."""
        profile = ([VolumeMount(name=self.browser.profile, path=PROFILE_PATH)]
                   if self.browser.profile is not None else [])
        return [*self.volumes, *profile]


class Failure(BaseModel):
    reason: str
    at: datetime


class SessionUrls(BaseModel):
    actions_ws: str
    vnc_ws: str
    view: str
    cdp_http: str
    cdp_ws: str


class Session(BaseModel):
    id: str
    state: SessionState
    backend: str
    display: Display
    browser: Browser
    created_at: datetime
    expires_at: datetime | None
    timeout_s: int
    labels: dict[str, str]
    coordinate_space: CoordinateSpace | None = None
    volumes: list[VolumeMount] = []
    failure: Failure | None = None
    ended_at: datetime | None = Field(
        default=None, description="when it became stopped or failed; null while live",
    )
    engine: dict[str, str] = Field(
        default_factory=dict,
        description="facts of the engine that runs it on this server, e.g. the vm "
        "engine's accelerator (kvm or tcg) and why; empty for engines with none",
    )
    urls: SessionUrls


class SessionList(BaseModel):
    sessions: list[Session] = Field(description="newest first")
    next_cursor: str | None = Field(
        default=None,
        description="pass as ?cursor= for the next page; null on the last page",
    )
