"""What the SDK returns: small frozen dataclasses read from the API's JSON (API.md)."""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = [
    "ActionsResult",
    "AnthropicResult",
    "Display",
    "ExecResult",
    "OpenAIResult",
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
    ended_at: str | None = None  # when it became stopped or failed

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
            ended_at=data.get("ended_at"),
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


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) read from a PNG, JPEG or WebP header; (0, 0) for anything else.

    The vendors' answers carry an image without its size, and Pillow is no dependency.
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP" and len(data) >= 30:
        chunk = data[12:16]
        if chunk == b"VP8 ":
            return (int.from_bytes(data[26:28], "little") & 0x3FFF,
                    int.from_bytes(data[28:30], "little") & 0x3FFF)
        if chunk == b"VP8L":
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        if chunk == b"VP8X":
            return (int.from_bytes(data[24:27], "little") + 1,
                    int.from_bytes(data[27:30], "little") + 1)
    if data.startswith(b"\xff\xd8"):
        at = 2
        while at + 9 <= len(data) and data[at] == 0xFF:
            marker, length = data[at + 1], int.from_bytes(data[at + 2:at + 4], "big")
            # SOF0..SOF15 carry the size; C4 (DHT), C8 and CC (DAC) are not frames.
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                return (int.from_bytes(data[at + 7:at + 9], "big"),
                        int.from_bytes(data[at + 5:at + 7], "big"))
            at += 2 + length
    return 0, 0


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


def _data_image(media_type: str, data_b64: str) -> Screenshot:
    data = base64.b64decode(data_b64)
    return Screenshot(data, media_type, *image_size(data))


def _settled(header: str | None) -> bool | None:
    return None if header is None else header.strip().lower() == "true"


_POSITION = re.compile(r"X=(-?\d+),\s*Y=(-?\d+)")


@dataclass(frozen=True)
class AnthropicResult:
    """What ``POST /actions/anthropic`` answered for one input of Anthropic's computer tool.

    ``content`` is the ``content`` of the ``tool_result`` block, as the server sent it (send
    it to the model as it is). Read from it: ``screenshot``, its image (the screen once it
    settled after acting, or what ``screenshot`` / ``zoom`` asked for), or ``cursor``, the
    pointer position that ``cursor_position`` answers. ``settled`` is False when the screen
    was still changing when the wait for it timed out (None: no settled screenshot).
    """

    content: list[dict[str, Any]]
    screenshot: Screenshot | None = None
    cursor: tuple[int, int] | None = None
    settled: bool | None = None

    @classmethod
    def from_json(cls, content: list[Any], settled: str | None = None) -> AnthropicResult:
        blocks = [dict(block) for block in content]
        shot: Screenshot | None = None
        cursor: tuple[int, int] | None = None
        for block in blocks:
            if block.get("type") == "image":
                source = block["source"]
                shot = _data_image(str(source["media_type"]), str(source["data"]))
            elif block.get("type") == "text" and (found := _POSITION.search(block["text"])):
                cursor = int(found[1]), int(found[2])
        return cls(blocks, shot, cursor, _settled(settled))


@dataclass(frozen=True)
class OpenAIResult:
    """What ``POST /actions/openai`` answered for a ``computer_call``'s action(s).

    ``output`` is the ``computer_call_output`` item to send back (``call_id`` in it when one
    was given); ``screenshot`` its image, taken once the screen settled after the last
    action. ``settled`` is False when the wait for that timed out (None: the call only
    asked for a screenshot).
    """

    output: dict[str, Any]
    screenshot: Screenshot
    settled: bool | None = None

    @classmethod
    def from_json(cls, output: Mapping[str, Any], settled: str | None = None) -> OpenAIResult:
        url = str(output["output"]["image_url"])
        header, _, data_b64 = url.partition(",")
        media_type = header.removeprefix("data:").removesuffix(";base64")
        return cls(dict(output), _data_image(media_type, data_b64), _settled(settled))


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


@dataclass(frozen=True)
class Volume:
    """A persistent volume (API.md "Volumes and browser profiles"); ``raw`` is the whole
    resource (size_mb, used_bytes, attached...)."""

    name: str
    raw: dict[str, Any] = field(repr=False, compare=False)
