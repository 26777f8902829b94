"""Persistent volumes on the wire (API.md "Volumes and browser profiles"): ``/v1/volumes``
and a session's ``volumes`` and ``browser.profile``."""

from __future__ import annotations

import posixpath
import re
from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .scalars import Bool, IntOnly

__all__ = [
    "MAX_VOLUME_MB", "MAX_VOLUMES", "MIN_VOLUME_MB", "PROFILE_PATH", "PROFILE_SIZE_MB",
    "Volume", "VolumeAttachment", "VolumeCreate", "VolumeList", "VolumeMount", "VolumeName",
]

MIN_VOLUME_MB = 16  # an ext4 journal and room to write
MAX_VOLUME_MB = 1_048_576  # 1 TiB: disk images are sparse, they take what is written
MAX_VOLUMES = 8  # per session
# Where the browser keeps its profile in every session (engines/desktop_commands.py):
# ``browser.profile`` mounts a volume there.
PROFILE_PATH = "/root/chromium"
PROFILE_SIZE_MB = 1024  # a profile volume made on first use
# The session's home and /tmp are its writable trees; anything else of the image is not.
_MOUNT_ROOTS = ("/root/", "/tmp/")
_COMPONENT = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

VolumeName = Annotated[str, Field(pattern=r"^[a-z0-9]([a-z0-9_.-]{0,62})$")]


def _mount_path(path: str) -> str:
    if not path.startswith(_MOUNT_ROOTS):
        raise ValueError("path must be under /root/ or /tmp/ (the session's writable trees)")
    parts = path.split("/")[2:]
    if posixpath.normpath(path) != path or not all(
        _COMPONENT.match(p) and p not in (".", "..") for p in parts
    ):
        raise ValueError("path must be an absolute, normalised path of plain names")
    if path == "/tmp/.X11-unix" or path.startswith("/tmp/.X11-unix/"):
        raise ValueError("/tmp/.X11-unix is the desktop's own")
    return path


MountPath = Annotated[str, Field(max_length=256), AfterValidator(_mount_path)]


class VolumeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: VolumeName
    size_mb: Annotated[int, Field(ge=MIN_VOLUME_MB, le=MAX_VOLUME_MB), IntOnly]


class VolumeMount(BaseModel):
    """One of a session's volumes: which, where, and whether it may write."""

    model_config = ConfigDict(extra="forbid")

    name: VolumeName
    path: MountPath
    read_only: Bool = False


class VolumeAttachment(BaseModel):
    session_id: str
    read_only: bool


class Volume(BaseModel):
    name: str
    size_mb: int
    created_at: datetime
    used_bytes: int  # what the disk image takes on the host (sparse)
    attached: list[VolumeAttachment]


class VolumeList(BaseModel):
    volumes: list[Volume]
