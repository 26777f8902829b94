"""What the SDK returns: small frozen dataclasses read from the API's JSON (API.md)."""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "ActionsResult",
    "Display",
    "ExecResult",
    "Screenshot",
    "SessionData",
    "SessionUrls",
    "Snapshot",
    "Token",
    "Upload",
]


def _str(data: Mapping[str, Any], key: str) -> str:
    return str(data.get(key) or "")


@dataclass(frozen=True)
class Display:
    width: int
    height: int
    dpi: int | None = None


@dataclass(frozen=True)
class SessionUrls:
    """Absolute URLs of a session's streams (API.md "Session resource")."""

    actions_ws: str = ""
    vnc_ws: str = ""
    view: str = ""
    cdp_http: str = ""
    cdp_ws: str = ""


@dataclass(frozen=True)
class SessionData:
    """A session resource as the server last described it."""

    id: str
    state: str
    backend: str
    display: Display
    labels: dict[str, str]
    created_at: str
    expires_at: str | None
    timeout_s: int | None
    failure: dict[str, Any] | None
    urls: SessionUrls
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SessionData:
        display = data.get("display") or {}
        urls = data.get("urls") or {}
        return cls(
            id=str(data["id"]),
            state=_str(data, "state"),
            backend=_str(data, "backend"),
            display=Display(
                int(display.get("width", 0)), int(display.get("height", 0)), display.get("dpi")
            ),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
            created_at=_str(data, "created_at"),
            expires_at=data.get("expires_at"),
            timeout_s=data.get("timeout_s"),
            failure=data.get("failure"),
            urls=SessionUrls(**{k: str(urls.get(k) or "") for k in SessionUrls.__annotations__}),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Screenshot:
    """An encoded image: ``data`` is PNG, JPEG or WebP bytes."""

    data: bytes = field(repr=False)
    media_type: str
    width: int
    height: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Screenshot:
        return cls(
            base64.b64decode(data["data_b64"]),
            str(data["media_type"]),
            int(data["width"]),
            int(data["height"]),
        )

    def image(self) -> Image:
        """The image decoded by Pillow."""
        return to_image(self.data)


def to_image(data: bytes) -> Image:
    try:
        from PIL import Image as PILImage
    except ImportError as missing:  # Pillow is the optional extra `deskbox[images]`
        raise ImportError(
            "decoding a screenshot needs Pillow: pip install 'deskbox[images]'"
        ) from missing

    image = PILImage.open(io.BytesIO(data))
    image.load()
    return image


@dataclass(frozen=True)
class ActionsResult:
    """Results of a batch of actions, one per action (``{}`` for most), and its screenshot.

    Image results (``screenshot``, ``zoom``) are :class:`Screenshot` objects; the others
    are the JSON objects of API.md (``{"x", "y"}`` for ``cursor_position``, ...).
    """

    results: list[dict[str, Any] | Screenshot]
    screenshot: Screenshot | None = None
    settled: bool = True

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionsResult:
        results: list[dict[str, Any] | Screenshot] = [
            Screenshot.from_json(r) if "data_b64" in r else dict(r) for r in data["results"]
        ]
        shot = data.get("screenshot")
        return cls(
            results,
            Screenshot.from_json(shot) if shot else None,
            bool(data.get("settled", True)),
        )


@dataclass(frozen=True)
class ExecResult:
    """What ``exec`` answered (API.md): ``exit_code`` is None on timeout or in background."""

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    pid: int | None = None
    duration_ms: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExecResult:
        return cls(
            exit_code=data.get("exit_code"),
            stdout=_str(data, "stdout"),
            stderr=_str(data, "stderr"),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            timed_out=bool(data.get("timed_out", False)),
            pid=data.get("pid"),
            duration_ms=data.get("duration_ms"),
        )

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class Upload:
    path: str
    size: int


@dataclass(frozen=True)
class Token:
    """A session token (API.md "Conventions"); ``token`` is shown once."""

    id: str
    token: str = field(repr=False)
    scope: str
    expires_at: str


@dataclass(frozen=True)
class Snapshot:
    id: str
    raw: dict[str, Any] = field(repr=False, compare=False)
