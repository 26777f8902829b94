"""The server's one settings object, read from ``DESKBOX_*`` variables or given directly."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .errors import InvalidSetting

__all__ = [
    "AGENT_MAX_EXEC_OUTPUT",
    "AGENT_MAX_EXEC_TIMEOUT_S",
    "AGENT_MAX_FILE_BYTES",
    "ROOT_IMAGE_CACHE",
    "Settings",
    "default_recipe_dir",
    "default_state_dir",
    "load_settings",
    "unknown_names",
]

# The session agent's own ceilings (desktop_image/agent/PROTOCOL.md "Limits"). A server
# cap above one was no cap: a file_max_bytes over 1 GiB had the agent refuse every file
# transfer, a larger output or timeout was cut to the agent's without a word.
AGENT_MAX_FILE_BYTES = 1024 * 1024 * 1024
AGENT_MAX_EXEC_OUTPUT = 16 * 1024 * 1024
AGENT_MAX_EXEC_TIMEOUT_S = 24 * 3600.0

# Root's image cache when none is set. Not under root's state dir: a sandbox's runc init
# mounts the image by its path as an unprivileged user of the host (its user namespace),
# and root's home is closed to other users (engines/runc/reach.py).
ROOT_IMAGE_CACHE = Path("/var/cache/deskbox")


# An entry of allowed_hosts: a DNS name, or one with a leading dot (its subdomains too).
_LABEL = r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?"
_HOST_NAME = re.compile(rf"\.?{_LABEL}(\.{_LABEL})*")


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "deskbox"


def default_recipe_dir() -> Path:
    """The repository's ``desktop_image/``, found from this package's place in the source tree.

    The recipe is not in the deskbox-server wheel: it reads files across the tree (the
    server's ``engines/data``, ``desktop_image/agent``), so the server runs from a checkout
    (``make setup`` installs it editable). A wheel install sets ``DESKBOX_RECIPE_DIR`` to a
    checkout's ``desktop_image/``; without one, the image build says so (engines/image.py).
    """
    return Path(__file__).resolve().parents[2] / "desktop_image"


class Settings(BaseSettings):
    """Constructor arguments win over ``DESKBOX_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="DESKBOX_", extra="ignore")

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8765
    # The names (beyond IP addresses, `localhost` and `host`) a request's Host may give,
    # and pages of which may open the websockets (api/hosts.py: DNS rebinding): "name",
    # ".example.com" (it and its subdomains), or "*" (any Host; not any page).
    allowed_hosts: Annotated[list[str], NoDecode] = []
    state_dir: Path = Field(default_factory=default_state_dir)
    # Comma-separated in DESKBOX_API_KEYS; empty: one key is generated into the state dir.
    api_keys: Annotated[list[str], NoDecode, Field(repr=False)] = []
    max_sessions: Annotated[int, Field(ge=0)] = 20
    max_sessions_per_key: Annotated[int, Field(ge=0)] = 10
    # How long the record of an ended session (stopped or failed) stays readable and listed.
    ended_session_ttl_h: Annotated[float, Field(gt=0)] = 7 * 24.0
    # The sizes of one API key's volumes, in all (disk images are sparse: a volume takes
    # on the host what was written to it, at most its size).
    volume_quota_mb: Annotated[int, Field(ge=0)] = 102_400
    # Session recordings (API.md "Recordings and trajectories"): one API key's on disk in
    # all, how long a stopped one is kept, and the video's frame cap and JPEG quality.
    recording_quota_mb: Annotated[int, Field(ge=0)] = 10_240
    # One API key's snapshots on disk in all (their packed checkpoints).
    snapshot_quota_mb: Annotated[int, Field(ge=0)] = 20_480
    recording_ttl_h: Annotated[float, Field(gt=0)] = 7 * 24.0
    recording_fps: Annotated[float, Field(gt=0, le=30)] = 4.0
    recording_quality: Annotated[int, Field(ge=1, le=100)] = 60
    # Checkpoint images that live about a second (a fork's; a snapshot's or a hibernation's
    # before they are packed; an archive's while it is restored) go to a private directory
    # in this tmpfs when it has room for the session's memory limit, and never reach the
    # disk (scratch.py). Empty: always the state dir.
    scratch_dir: str = "/dev/shm"
    default_backend: str = "container"
    # The backends this server offers (DESKBOX_BACKENDS=container,vm,local). "vm": a QEMU
    # microVM per session. "local" runs unisolated host processes: offer it only on a
    # machine you trust.
    backends: Annotated[list[str], NoDecode] = ["container"]
    # Session images live in <image_state_dir>/images/<recipe hash>/; default: as root
    # ROOT_IMAGE_CACHE, else state_dir. Several state dirs (tests, CI) can share one cache.
    image_state_dir: Path | None = None
    recipe_dir: Path = Field(default_factory=default_recipe_dir)
    # The vm engine's accelerator: auto (KVM where /dev/kvm runs a stock guest, else TCG),
    # kvm (refuse to start without it) or tcg.
    vm_accelerator: Literal["auto", "kvm", "tcg"] = "auto"
    # The docker engine's Engine API (Docker, or `podman system service`); empty: DOCKER_HOST,
    # else Docker's default socket.
    docker_host: str = ""
    # The kubernetes engine. kubernetes_api: the API server's URL without credentials (a
    # `kubectl proxy`, a stand-in); empty: in-cluster, else the kubeconfig. namespace:
    # empty is the server pod's own. image: the session image as the nodes pull it.
    # fleet: the label value of this server's pods. server_namespace: where the server's
    # own pods run, if not in `namespace` (their NetworkPolicies let only them in).
    kubernetes_api: str = ""
    kubernetes_namespace: str = ""
    kubernetes_server_namespace: str = ""
    kubernetes_image: str = ""
    kubernetes_fleet: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")] = (
        "deskbox")
    kubernetes_runtime_class: str = ""
    kubernetes_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    # The StorageClass of the volumes' PersistentVolumeClaims; empty: the cluster's default.
    kubernetes_storage_class: str = ""
    # Where session records and tokens live. local: this server's state dir (one server).
    # cluster: the kubernetes engine's cluster (a Secret per session), so that several
    # server replicas serve every session (docs/GUIDE.md "Several server replicas").
    registry: Literal["local", "cluster"] = "local"
    # This replica's name and uid among the fleet's servers (in a pod: its own, from the
    # downward API); empty name: a random one per process.
    kubernetes_replica: Annotated[
        str, Field(pattern=r"^([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?)?$")] = ""
    kubernetes_replica_uid: str = ""
    # The replica's Lease's duration in seconds (renewed every third of it): a replica whose
    # Lease stayed unchanged for three is dead, and another removes what it left.
    kubernetes_lease_s: Annotated[int, Field(ge=1, le=3600)] = 30
    # X display numbers [display_first, display_last) for container sessions.
    display_first: Annotated[int, Field(ge=1, le=65535)] = 200
    display_last: Annotated[int, Field(ge=2, le=65536)] = 1000
    idle_timeout_s: Annotated[int, Field(ge=1)] = 900
    max_timeout_s: Annotated[int, Field(ge=1)] = 7 * 24 * 3600
    reaper_interval_s: Annotated[float, Field(gt=0)] = 5.0
    start_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    # A call into a desktop (an action batch, a screenshot) that has not returned after this
    # long, plus what the batch itself may take (its waits, holds, typing: settle.py),
    # means its X server does not answer (stopped, or held by a grab): the session fails.
    desktop_call_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    # How long stopping a session may take (DELETE, expiry, shutdown) before it is given up
    # as failed; the removal of what is left goes on in the background.
    stop_timeout_s: Annotated[float, Field(gt=0)] = 20.0
    # At shutdown (SIGTERM), requests still running get this long to finish before they are
    # cancelled (a hibernate, resume or snapshot goes on: sessions/in_flight.py); then every
    # session is stopped.
    shutdown_grace_s: Annotated[int, Field(ge=1)] = 3
    max_request_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    retry_after_s: Annotated[int, Field(ge=1)] = 5
    # exec and files (api/exec.py): what a sandbox may send back or be sent.
    exec_output_max_bytes: Annotated[  # stdout, stderr each
        int, Field(ge=1, le=AGENT_MAX_EXEC_OUTPUT)] = 1024 * 1024
    exec_max_timeout_s: Annotated[float, Field(gt=0, le=AGENT_MAX_EXEC_TIMEOUT_S)] = 3600.0
    file_max_bytes: Annotated[int, Field(ge=1, le=AGENT_MAX_FILE_BYTES)] = 100 * 1024 * 1024
    # Commands and file transfers one session may run at once (each a host-side runc
    # exec); more are answered 429 with Retry-After, at once.
    exec_max_concurrent: Annotated[int, Field(ge=1, le=1024)] = 8
    # The CDP proxy (api/cdp.py, cdp_relay.py): a larger DevTools message, either way,
    # closes the connection (1009). A client more than cdp_client_buffer_bytes behind the
    # browser (one message may always wait), or that takes nothing for ws_send_timeout_s,
    # is dropped (1008); so is the one furthest behind when a session's clients together
    # are more than cdp_session_buffer_bytes behind.
    cdp_max_message_bytes: Annotated[int, Field(ge=64 * 1024)] = 64 * 1024 * 1024
    cdp_client_buffer_bytes: Annotated[int, Field(ge=64 * 1024)] = 64 * 1024 * 1024
    cdp_session_buffer_bytes: Annotated[int, Field(ge=64 * 1024)] = 128 * 1024 * 1024
    # Slow or stalled clients (api/errors.py, api/actions.py, vnc/proxy.py): a request body
    # that stops arriving for body_idle_timeout_s is answered 408; a websocket client that
    # takes no reply for ws_send_timeout_s is dropped; a live-view viewer more than
    # vnc_viewer_buffer_bytes behind the VNC server is dropped.
    body_idle_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    # A connection that has not sent a whole request head this long after it opened (or
    # after the answer to its last request) is closed (http_protocol.py: slowloris).
    request_head_timeout_s: Annotated[float, Field(gt=0)] = 15.0
    ws_send_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    vnc_viewer_buffer_bytes: Annotated[int, Field(ge=1024 * 1024)] = 32 * 1024 * 1024

    # The warm pool (sessions/pool.py): this many ready sessions of the default backend per
    # display size in pool_displays (DESKBOX_POOL_DISPLAYS=1280x800,1024x768); 0: no pool.
    pool_size: Annotated[int, Field(ge=0, le=64)] = 0
    pool_displays: Annotated[list[str], NoDecode] = ["1280x800"]

    @field_validator("pool_displays", mode="before")
    @classmethod
    def _split_displays(cls, value: object) -> object:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list):
            for item in value:
                width, _, height = str(item).partition("x")
                if not (width.isdigit() and height.isdigit()):
                    raise ValueError(f"pool display {item!r} is not WIDTHxHEIGHT")
        return value

    @model_validator(mode="after")
    def _some_display(self) -> Self:
        # An empty range was taken, and every container session then failed to start.
        if self.display_first >= self.display_last:
            raise ValueError(
                f"DESKBOX_DISPLAY_FIRST ({self.display_first}) must be below "
                f"DESKBOX_DISPLAY_LAST ({self.display_last}): no display number is left")
        return self

    @field_validator("api_keys", "backends", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [key.strip() for key in value.split(",") if key.strip()]
        return value

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list):
            return value
        names = [str(item).strip().lower().removesuffix(".") for item in value
                 if str(item).strip()]
        for name in names:
            if name != "*" and not _HOST_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a host name, .domain (it and its subdomains) or * "
                    "(no scheme, port or path; IP addresses and localhost need no entry)")
        return names

    @property
    def database_path(self) -> Path:
        return self.state_dir / "sessions.sqlite3"

    @property
    def api_key_path(self) -> Path:
        return self.state_dir / "api_key"

    @property
    def image_cache_dir(self) -> Path:
        """What ``desktop_image/build.py --state-dir`` is given: images go under its images/."""
        if self.image_state_dir is not None:
            return self.image_state_dir
        return ROOT_IMAGE_CACHE if os.geteuid() == 0 else self.state_dir

    @property
    def docker_url(self) -> str:
        return self.docker_host or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


_PREFIX = "DESKBOX_"
# DESKBOX_* names that are not the server's settings but that other parts of Deskbox read,
# and may be in the server's environment: the client's (SDK, CLI, MCP), scripts/'s (CRIU,
# nginx), the tests', and those the desktops' processes carry (engines/desktop_commands.py,
# engines/processes.py). tests/test_settings_names.py keeps it whole.
OTHER_NAMES = frozenset({
    "URL", "API_KEY", "MAX_RETRIES",
    "CRIU_WRAPPER", "CRIU_ROOT", "CRIU_PATCH", "CRIU_SUITE", "CRIU_MIRROR", "NGINX_ROOT",
    "FUZZ_EXAMPLES", "FUZZ_PHASES", "FUZZ_SESSION",
    "AGENT", "BROWSER", "CLIPBOARD", "INIT_LOGS", "PROCESS_OWNER", "PROCESS_SET", "WM",
    "XSERVER",
})


# What Kubernetes gives every container for each Service of its namespace (its "service
# links"): the server's own Service, deskbox-server (deploy/kubernetes/server.yaml), gives
# DESKBOX_SERVER_SERVICE_HOST, DESKBOX_SERVER_PORT=tcp://..., DESKBOX_SERVER_PORT_8765_TCP...
_SERVICE_LINK = re.compile(
    r"^DESKBOX_[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?"
    r"|PORT(_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$")


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """Each ``DESKBOX_*`` variable of ``environ`` that nothing of Deskbox reads, said with
    the setting it is closest to: a misspelt setting was ignored without a word, and the
    server ran on the default."""
    settings = [_PREFIX + name.upper() for name in Settings.model_fields]
    known = {*settings, *(_PREFIX + name for name in OTHER_NAMES)}
    found = []
    for name in sorted(environ):
        # pydantic-settings reads the names whatever their case.
        upper = name.upper()
        if not upper.startswith(_PREFIX) or upper in known or _SERVICE_LINK.match(upper):
            continue
        close = difflib.get_close_matches(upper, settings, n=1, cutoff=0.8)
        found.append(f"{name} is not a setting" + (f" (did you mean {close[0]}?)" if close
                                                    else ""))
    return found


def load_settings(
    given: Mapping[str, object] | None = None, options: Mapping[str, str] | None = None,
) -> Settings:
    """The settings of ``given`` (a command's options) over the ``DESKBOX_*`` variables.

    InvalidSetting, in one line naming each variable (or ``options[field]``, the option that
    gave it) and what is wrong with it, for a value the server cannot take or a
    ``DESKBOX_*`` name that is no setting (docs/GUIDE.md#settings lists them)."""
    problems = unknown_names(os.environ)
    settings: Settings | None = None
    try:
        settings = Settings(**dict(given or {}))  # type: ignore[arg-type]
    except ValidationError as error:
        problems += [_said(detail, options or {}) for detail in error.errors()]
    if problems or settings is None:
        raise InvalidSetting("; ".join(problems) + " (every setting: docs/GUIDE.md#settings)")
    return settings


def _said(detail: Mapping[str, object], options: Mapping[str, str]) -> str:
    """One of pydantic's errors, for an operator: the variable or option, then why."""
    loc = detail.get("loc")
    message = str(detail.get("msg", "")).removeprefix("Value error, ")
    field = str(loc[0]) if isinstance(loc, tuple) and loc else None
    if field is None:  # the model's own check: its message names the settings
        return message
    name = options.get(field, _PREFIX + field.upper())
    shown = "" if field == "api_keys" else f" (got {detail.get('input')!r})"  # never a key
    return f"{name}: {message}{shown}"
