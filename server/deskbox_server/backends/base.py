"""The backend interface: how a session's desktop is made, reached and destroyed.

Everything above this module is backend-agnostic. A backend turns a :class:`SessionSpec`
into a :class:`DesktopHandle`, through which the session layer runs action batches, grabs
the screen, and reaches exec, files, the live view and DevTools.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from ..errors import InvalidRequest, SessionFailed
from ..media import Frame
from ..sandbox_io import ExecCommand, ExecResult, FileDownload
from ..schemas import actions as a
from ..schemas.results import BatchResult
from ..schemas.sessions import Network, Resources
from .desktop_commands import DesktopSpec
from .devtools import DevtoolsSocket
from .vnc_server import VncServer

__all__ = ["Backend", "DesktopHandle", "SessionSpec", "SnapshotInfo"]


@dataclass(frozen=True)
class SessionSpec:
    """What the session layer asks a backend for (already validated wire values)."""

    id: str
    desktop: DesktopSpec
    resources: Resources | None = None
    network: Network | None = None
    # A snapshot's directory (the session layer found it and checked it is the caller's).
    from_snapshot: Path | None = None
    record: bool = False
    # Started ahead of demand (the warm pool): no start-up boost that could slow the
    # sessions that run.
    background: bool = False


@dataclass(frozen=True)
class SnapshotInfo:
    seconds: float
    raw_bytes: int
    compressed_bytes: int | None  # None: the images were left raw (a fork's)


class DesktopHandle(ABC):
    """One live desktop."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the desktop is broken (a process died, its agent stopped answering), or None
        while it is healthy.

        Cheap and thread-safe: the reaper calls it from the event loop.
        """

    @abstractmethod
    async def run(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        """The batch, within its deadline (settle.py); past it the desktop counts as stalled
        (DesktopFailed, and :meth:`failure` says so from then on)."""

    @abstractmethod
    async def grab(self) -> Frame:
        """The whole screen's pixels, now (kept as the last frame of a paused session)."""

    async def let_go(self) -> None:
        """Drop the host's connections to the desktop and leave it running (a server that
        stops after re-adopting it, or hands it to the next server)."""
        return None

    # exec and files (API.md): only inside a sandbox. A handle without one refuses them.
    no_sandbox: ClassVar[str] = "this session's backend has no sandbox to run them in"

    def _refuse(self, what: str) -> InvalidRequest:
        return InvalidRequest(f"{what} is not available: {self.no_sandbox}")

    async def exec(self, command: ExecCommand) -> ExecResult:
        """Run ``command`` inside the sandbox, as its processes run, with DISPLAY set."""
        raise self._refuse("exec")

    async def read_file(self, path: str, limit: int) -> FileDownload:
        """Open the absolute ``path`` as the sandbox resolves it; FileTooLarge over ``limit``."""
        raise self._refuse("reading files")

    async def write_file(self, path: str, chunks: AsyncIterable[bytes], limit: int) -> int:
        """Replace ``path`` inside the sandbox with ``chunks`` (at most ``limit`` bytes)."""
        raise self._refuse("writing files")

    async def start_vnc(self) -> VncServer:
        """Start a VNC server on this desktop that only the host can reach (vnc_server.py)."""
        raise InvalidRequest("this session's backend offers no live view")

    async def open_devtools(self) -> DevtoolsSocket:
        """A new connection to the browser's DevTools server (backends/devtools.py).

        BrowserUnavailable while the browser does not accept connections.
        """
        raise InvalidRequest("this session's backend offers no DevTools connection")


class Backend(ABC):
    """Makes and destroys desktops. Implementations: ``local`` (no isolation), ``container``."""

    name: ClassVar[str]

    async def prepare(self) -> None:
        """Get ready to serve (e.g. build the session image); called once at server start."""
        return None

    async def adopt(self, spec: SessionSpec) -> DesktopHandle:
        """Take over a desktop that a previous server process started and left running.

        Raises SessionFailed (with the reason) when it cannot: the desktop is gone, or this
        backend's desktops do not outlive their server.
        """
        raise SessionFailed(f"the {self.name} backend's desktops do not outlive their server")

    async def adopt_hibernated(self, spec: SessionSpec) -> DesktopHandle:
        """Take over a desktop a previous server hibernated (:meth:`restore` brings it back).

        Raises SessionFailed (with the reason) when its checkpoint is gone or unusable.
        """
        raise SessionFailed(f"the {self.name} backend cannot hibernate sessions")

    async def release(self, handle: DesktopHandle) -> None:
        """Let go of a hibernated desktop at server shutdown, keeping its checkpoint for
        :meth:`adopt_hibernated` by the next server."""
        await self.destroy(handle)

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        """Destroy what previous servers left of sessions not in ``keep``; their ids."""
        return []

    def check(self, spec: SessionSpec) -> None:
        """Raise InvalidRequest for what this backend cannot honour, before anything starts."""
        return None

    @abstractmethod
    async def create(self, spec: SessionSpec, timeout_s: float) -> DesktopHandle:
        """Start a desktop and return once its start page has been painted."""

    @abstractmethod
    async def destroy(self, handle: DesktopHandle) -> None:
        """Stop every process of the desktop; idempotent; never raises for a dead desktop."""

    async def freeze(self, handle: DesktopHandle) -> None:
        """Stop every process of the desktop where it stands (pause mode "freeze").

        The caller makes no X call on the desktop until :meth:`thaw`; :meth:`destroy` must
        work on a frozen desktop.
        """
        raise InvalidRequest(f"the {self.name} backend cannot freeze sessions")

    async def thaw(self, handle: DesktopHandle) -> None:
        """Let a frozen desktop run again."""
        raise InvalidRequest(f"the {self.name} backend cannot freeze sessions")

    async def hibernate(self, handle: DesktopHandle) -> None:
        """Checkpoint the desktop to disk and free its memory (pause mode "hibernate").

        Raises InvalidRequest naming the cause where it cannot.
        """
        raise InvalidRequest(f"the {self.name} backend cannot hibernate sessions")

    async def restore(self, handle: DesktopHandle) -> None:
        """Bring a hibernated desktop back, with its agent connected again."""
        raise InvalidRequest(f"the {self.name} backend cannot hibernate sessions")

    async def snapshot(
        self, handle: DesktopHandle, directory: Path, packed: bool = True
    ) -> SnapshotInfo:
        """Checkpoint the running desktop into the new ``directory``; it keeps running.

        ``packed``: compressed, to keep; else raw, for copies made at once (a fork).
        :meth:`create` with ``SessionSpec.from_snapshot`` makes a copy from it. Raises
        InvalidRequest naming the cause where it cannot.
        """
        raise InvalidRequest(f"the {self.name} backend cannot snapshot sessions")

    async def close(self) -> None:
        """Release what the backend itself holds (called once, at server shutdown)."""
        return None
