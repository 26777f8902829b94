"""What ``exec`` and ``files`` exchange with a backend (API.md), independent of how it runs.

A backend that has a sandbox runs commands and file I/O *inside* it; one without a
sandbox (``local``) refuses them rather than touching the host (``DesktopHandle`` in
engines/base.py). Everything that comes back out of a sandbox is bounded here by the caller's
limits: output, file sizes, how long anything may take.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from .errors import InvalidRequest

__all__ = [
    "MAX_PATH_BYTES",
    "ExecCommand",
    "ExecResult",
    "FileDownload",
    "FileTooLarge",
    "check_sandbox_path",
]

MAX_PATH_BYTES = 4096  # PATH_MAX


@dataclass(frozen=True)
class ExecCommand:
    """One command for :meth:`DesktopHandle.exec` (argv only: no shell is involved)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 30.0
    background: bool = False
    output_limit: int = 1 << 20  # bytes kept of stdout and of stderr, each


@dataclass(frozen=True)
class ExecResult:
    """How a command ended.

    ``exit_code`` is the command's status (128 + N when signal N ended it, 126/127 when it
    could not be started), or None when it timed out (``timed_out``; it was killed with
    its process tree) or runs in the background (``pid`` is then its pid in the sandbox).
    Output beyond ``output_limit`` is dropped and flagged, never buffered.
    """

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    pid: int | None = None
    duration_s: float = 0.0


class FileTooLarge(InvalidRequest):
    """Over the server's file size cap (or the sandbox's free space): 413."""

    status = 413


class FileDownload(ABC):
    """A file being read out of a sandbox: its size, then its bytes, then ``aclose``.

    ``size`` is what the file's metadata said when it was opened (files of /proc say 0);
    ``chunks`` yields at most ``size`` bytes when ``size`` > 0 and at most the caller's
    limit otherwise, and raises if the sandbox sends fewer or more than it promised.
    """

    size: int

    @abstractmethod
    def chunks(self) -> AsyncIterator[bytes]:
        """The file's bytes, in pieces of bounded size; iterate once."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop reading and end whatever reads inside the sandbox; idempotent."""


def check_sandbox_path(path: str) -> str:
    """An absolute path for the sandbox, as given (it is resolved in there, not here)."""
    if not path.startswith("/"):
        raise InvalidRequest(f"path {path!r} is not absolute: give a path such as /tmp/file")
    if "\0" in path:
        raise InvalidRequest("path may not contain NUL characters")
    if path.endswith("/"):
        # The sandbox's resolver would drop it: an upload to "/tmp/out/" wrote /tmp/out.
        raise InvalidRequest(f"path {path[-64:]!r} ends in '/': give a file's path")
    if len(path.encode("utf-8", errors="surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidRequest(f"path is longer than {MAX_PATH_BYTES} bytes")
    return path
