"""The engine interface: what makes, reaches and destroys the sandboxes sessions run in.

An engine only has to start a sandbox whose agent (``deskbox-agent``, desktop_image/agent/)
listens, and hand the session layer one byte stream to that agent (:meth:`Engine.open_stream`);
everything a session does to its desktop goes over that stream (sessions/desktop.py). What
an engine can do beyond that is declared in :attr:`Engine.capabilities` and
:attr:`Engine.egress_modes`, and a request that needs what it lacks is refused with an
error that names it (:class:`EngineLacks`), before anything starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from ..errors import InvalidRequest, SessionFailed
from ..schemas.sessions import MIN_CPUS, Network, Resources
from .desktop_commands import DesktopSpec

__all__ = [
    "AgentStream",
    "Capability",
    "CpusBelowFloor",
    "CpusFloor",
    "Engine",
    "EngineLacks",
    "Sandbox",
    "SessionSpec",
    "SharedEntry",
    "SharedRecords",
    "SnapshotInfo",
    "StartTogether",
    "VolumeAttach",
]

AgentStream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Capability(StrEnum):
    """What an engine may offer beyond making, reaching and destroying sandboxes."""

    FREEZE = "freeze"  # stop every process where it stands, and go on (pause "freeze")
    # Checkpoint to disk and restore: pause "hibernate", snapshots, forks, from_snapshot.
    CHECKPOINT = "checkpoint"
    EXEC = "exec"  # commands and files inside the sandbox, through its agent
    RESOURCES = "resources"  # per-session CPU, memory and process limits
    ADOPT = "adopt"  # sandboxes outlive their server and the next one takes them over
    VOLUMES = "volumes"  # persistent volumes mounted into the sandbox (SessionSpec.volumes)


@dataclass(frozen=True)
class SharedEntry:
    """One session's record as a fleet of servers shares it (:class:`SharedRecords`): the
    registry's JSON of it, and its session tokens' JSON by the SHA-256 of each token."""

    session_id: str
    record: str
    tokens: dict[str, str] = field(default_factory=dict)
    # The stored version (a resourceVersion), for a write only if nobody wrote since.
    version: str = ""


class SharedRecords(Protocol):
    """Where every server of a fleet keeps the sessions' records and tokens (the cluster,
    for the kubernetes engine), so that any of them serves any session. What is kept is
    opaque here: the session layer's JSON."""

    async def put(self, session_id: str, owner: str, live: bool, record: str) -> None:
        """Write a session's record (made on first write); ``live``: whether it may still
        run, for :meth:`live`."""

    async def put_if(self, session_id: str, live: bool, record: str, version: str) -> bool:
        """Write the record (as :meth:`put`) only if it is still at ``version``; whether
        it was."""
        ...

    async def read(self, session_id: str) -> SharedEntry | None: ...

    async def owned(self, owner: str) -> list[SharedEntry]: ...

    async def live(self) -> list[SharedEntry]: ...

    async def ended(self) -> list[SharedEntry]: ...

    async def delete(self, session_id: str) -> None: ...

    async def add_token(self, session_id: str, digest: str, token: str,
                        expired: Collection[str] = ()) -> bool:
        """Keep a token's JSON under its digest, and forget the ``expired`` digests (in
        one write); False if the session has no record."""
        ...

    async def drop_token(self, session_id: str, digest: str) -> None: ...


class EngineLacks(InvalidRequest):
    """A request that needs a capability (or an egress mode) the session's engine lacks."""

    def __init__(self, engine: str, needed_for: str, lacking: str, hint: str = "") -> None:
        message = f"{needed_for} needs {lacking}, which the {engine} engine lacks"
        super().__init__(f"{message}; {hint}" if hint else message)
        self.engine = engine
        self.lacking = lacking


@dataclass(frozen=True)
class CpusFloor:
    """The least ``resources.cpus`` an engine's sessions may have on this host, and why
    (a few words, for the refusal; empty for the schema's own floor)."""

    cpus: float
    why: str = ""


class CpusBelowFloor(InvalidRequest):
    """A ``resources.cpus`` below the least the session's engine takes on this host."""

    def __init__(self, engine: str, asked: float, floor: CpusFloor) -> None:
        message = (f"resources.cpus {asked:g} is below {floor.cpus:g}, the least the {engine} "
                   "engine takes on this host")
        super().__init__(f"{message}: {floor.why}" if floor.why else message)
        self.engine = engine
        self.floor = floor.cpus


class StartTogether:
    """The copies of one fork, let go at one moment once all of them are restored.

    A copy that ran while the others were still being restored took the CPU those
    restores were bound by (an animated page: bench/README.md, "the copies let go
    together"). An engine's restore waits here, on its own thread, just before the copy's
    processes run; the session layer calls :meth:`abort` for a copy that fails, so that
    the others go on without it. Engines that cannot hold a restored copy ignore it.
    """

    def __init__(self, count: int, timeout_s: float = 60.0) -> None:
        self._barrier = threading.Barrier(count, timeout=timeout_s)

    def wait(self) -> None:
        """Block until every copy waits here, or one failed (then return at once)."""
        with contextlib.suppress(threading.BrokenBarrierError):
            self._barrier.wait()

    def abort(self) -> None:
        self._barrier.abort()


@dataclass(frozen=True)
class SessionSpec:
    """What the session layer asks an engine for (already validated wire values)."""

    id: str
    desktop: DesktopSpec = field(default_factory=DesktopSpec)
    resources: Resources | None = None
    network: Network | None = None
    # A snapshot's directory (the session layer found it and checked it is the caller's).
    from_snapshot: Path | None = None
    # The pod's RuntimeClass (engines with runtime_classes), else the engine's default.
    runtime_class: str | None = None
    # Started ahead of demand (the warm pool): no start-up boost that could slow the
    # sessions that run.
    background: bool = False
    # Persistent volumes to mount (engines with Capability.VOLUMES); the session layer
    # checked they are the caller's and free to attach so.
    volumes: tuple[VolumeAttach, ...] = ()
    # One of a fork's copies (from_snapshot is the fork's checkpoint): run with the others.
    together: StartTogether | None = None


@dataclass(frozen=True)
class VolumeAttach:
    """One volume of a session: its disk image (ext4, engines/volumes.py) and where it
    appears in the sandbox."""

    name: str
    disk: Path
    path: str
    read_only: bool = False
    # The volume's identity across engines ("<owner>/<name>"; a cluster's claim is named
    # after it) and its size: what an engine that keeps volumes of its own needs.
    key: str = ""
    size_mb: int = 0


@dataclass(frozen=True)
class SnapshotInfo:
    seconds: float
    raw_bytes: int
    compressed_bytes: int | None  # None: the images were left raw (a fork's)


class Sandbox(ABC):
    """One sandbox of an engine: what the session layer needs to know of it."""

    # Seconds of each stage of its start, restore, hibernation (logs and benchmarks).
    timings: dict[str, float]

    @property
    @abstractmethod
    def label(self) -> str:
        """The sandbox in messages: "the sandbox ID", "the desktop :N"."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the sandbox is broken (its init or one of its processes exited), or None.

        Cheap and thread-safe: the reaper calls it from the event loop.
        """

    def held(self) -> str | None:
        """Why its processes stand still by someone else's doing, not this server's (a
        ``docker pause`` of its container, a ``runc pause``), or None. They go on when that
        someone lets them: calls are refused meanwhile, and the session does not fail.
        Cheap, as :meth:`failure`."""
        return None

    @property
    def running(self) -> bool:
        """Whether its processes run (a checkpointed sandbox's do not)."""
        return True

    @property
    @abstractmethod
    def agent_display(self) -> str:
        """The desktop's X display as the agent names it (``:N``)."""

    @property
    @abstractmethod
    def vnc_socket_dir(self) -> str:
        """A directory, as the agent sees it, where the VNC server may put its socket."""

    @property
    @abstractmethod
    def devtools_port(self) -> int:
        """The browser's DevTools port, as the agent reaches it (its loopback)."""

    def exec_environment(self) -> tuple[dict[str, str], str]:
        """The environment (with ``DISPLAY``) and working directory of commands run in the
        sandbox (engines with :attr:`Capability.EXEC`): by default only ``DISPLAY``, in /."""
        return {"DISPLAY": self.agent_display}, "/"

    @property
    def max_execs(self) -> int:
        """Commands and file transfers one session may run at once."""
        return 0


S = TypeVar("S", bound=Sandbox)


class Engine(ABC, Generic[S]):
    """Makes and destroys sandboxes, and opens streams to their agents.

    Implementations: ``container`` (runc, engines/runc/) and ``local`` (host processes,
    no isolation, engines/local/). The optional methods below raise :class:`EngineLacks`
    unless :attr:`capabilities` names them.
    """

    name: ClassVar[str]
    # An instance may narrow its class's set once it knows its host (prepare()): a rootless
    # container engine without cgroups can neither pause nor limit.
    capabilities: frozenset[Capability] = frozenset()
    egress_modes: ClassVar[frozenset[str]] = frozenset({"all"})
    # Whether a session may name the runtime its sandbox runs under (a RuntimeClass).
    runtime_classes: ClassVar[bool] = False
    # What to do instead, in the refusal of what this engine lacks.
    hint: ClassVar[str] = ""
    # A start never gets less than this, whatever the server's start_timeout_s: a VM under
    # software emulation needs a minute where a container needs a second.
    start_timeout_floor_s: ClassVar[float] = 0.0
    # The agent's first answer over a new stream (its SETTINGS and /v1/hello).
    handshake_timeout_s: ClassVar[float] = 5.0
    # Whether the agent closing its end of the stream ends the host's end too (EOF), so
    # that the host can wait for it before a checkpoint. Not through a device QEMU holds
    # open (a VM's virtio-serial port): the VM engine waits for the port's event itself.
    stream_ends_with_agent: ClassVar[bool] = True
    # Whether a create cancelled midway (asyncio) leaves nothing behind: the warm pool then
    # cancels a start it no longer wants at shutdown instead of waiting it out (a VM's boot
    # under TCG takes minutes; runc's start runs in a thread, which cannot be cancelled).
    create_cancellable: ClassVar[bool] = False
    # Where a fleet of servers shares the sessions' records, if this engine's sandboxes can
    # be reached from every server of one (a cluster's pods): DESKBOX_REGISTRY=cluster.
    shared_records: SharedRecords | None = None

    def start_timeout(self, configured_s: float) -> float:
        """The deadline of one start of this engine's sandboxes (desktop painted)."""
        return max(configured_s, self.start_timeout_floor_s)

    def least_cpus(self) -> CpusFloor:
        """The least ``resources.cpus`` a session may ask for (:meth:`check` refuses less,
        before anything starts): the schema's own floor unless an engine's desktops are
        unusable above it."""
        return CpusFloor(MIN_CPUS)

    def describe(self) -> dict[str, str]:
        """What an operator should know of this engine on this host (``GET /healthz``),
        e.g. which accelerator a VM runs on."""
        return {}

    def lacks(
        self, capability: Capability, needed_for: str, hint: str | None = None
    ) -> EngineLacks:
        """The refusal, with ``hint`` (what has it) where the engine's own hint, about what
        it lacks most, would mislead."""
        return EngineLacks(self.name, needed_for, f"the capability {capability.value!r}",
                           hint or self.hint)

    async def drop_volume(self, key: str) -> None:
        """The volume ``key`` (VolumeAttach.key) was deleted: forget what this engine keeps
        of it (a cluster's claim). Engines that mount the server's disk images keep nothing."""
        return None

    def require(
        self, capability: Capability, needed_for: str, hint: str | None = None
    ) -> None:
        if capability not in self.capabilities:
            raise self.lacks(capability, needed_for, hint)

    def check(self, spec: SessionSpec) -> None:
        """Refuse what this engine cannot honour, before anything starts. Called off the
        event loop: it may read the files of ``spec.from_snapshot``."""
        if spec.from_snapshot is not None:
            self.require(Capability.CHECKPOINT, "from_snapshot")
        if spec.runtime_class is not None and not self.runtime_classes:
            raise EngineLacks(self.name, "runtime_class", "runtime classes",
                              "the kubernetes backend has them")
        if spec.resources is not None:
            self.require(Capability.RESOURCES, "resources")
            floor = self.least_cpus()
            if spec.resources.cpus < floor.cpus:
                raise CpusBelowFloor(self.name, spec.resources.cpus, floor)
        if spec.volumes:
            self.require(Capability.VOLUMES, "volumes (and browser profiles)",
                         "the container, vm and kubernetes backends have it")
        if spec.network is not None and spec.network.egress not in self.egress_modes:
            offered = ", ".join(repr(m) for m in sorted(self.egress_modes))
            raise EngineLacks(self.name, f"network egress {spec.network.egress!r}",
                              "that egress mode", f"it offers {offered}")

    async def prepare(self) -> None:
        """Get ready to serve (e.g. build the session image); called once at server start."""
        return None

    async def close(self) -> None:
        """Release what the engine itself holds (called once, at server shutdown)."""
        return None

    async def problem(self) -> str | None:
        """What keeps this engine from starting sessions now, or None (``GET /healthz``,
        which asks on every call: it must be cheap)."""
        return None

    # -- the interface every engine has ------------------------------------------------

    @abstractmethod
    async def create(self, spec: SessionSpec, timeout_s: float) -> S:
        """Start a sandbox and return once its agent listens (:meth:`open_stream` works).

        The desktop's own readiness (window manager, browser painted) is its agent's to
        tell; the session layer then calls :meth:`started`.
        """

    async def claimed(self, sandbox: S) -> None:
        """A sandbox started ahead of demand (``SessionSpec.background``: the warm pool)
        became a caller's session."""
        return None

    async def started(self, sandbox: S, timeout_s: float) -> None:
        """The desktop is ready (a new one; a restored or saved one, or a snapshot's copy,
        once its agent answers again): end what only its start-up, restore or save needed
        (a CPU boost)."""
        return None

    @abstractmethod
    async def open_stream(self, sandbox: S, read_limit: int) -> AgentStream:
        """A new byte stream to the sandbox's agent (SessionFailed if it has none).

        ``read_limit``: the reader's buffer limit. Whatever answers is treated as hostile
        by the caller (agent/connection.py).
        """

    @abstractmethod
    async def destroy(self, sandbox: S) -> None:
        """Stop every process of the sandbox and remove it; idempotent; never raises for
        a dead or frozen sandbox, and never waits on its agent."""

    async def stop(self, sandbox: S) -> None:
        """Let the sandbox end its programs in order, briefly (what :meth:`kill` does not):
        engines whose sandboxes keep state beyond themselves (volumes) do. Bounded, never
        waits on the agent, never raises for a dead or frozen sandbox."""
        return None

    async def kill(self, sandbox: S) -> None:
        """Stop every process of the sandbox now (what :meth:`destroy` does first): a
        call waiting on its agent then ends with its stream."""
        return None

    async def adopt(self, session_id: str) -> S:
        """Take over a sandbox a previous server process started and left running.

        SessionFailed (with the reason) when it cannot: the sandbox is gone, or this
        engine's sandboxes do not outlive their server.
        """
        raise SessionFailed(f"the {self.name} engine's sandboxes do not outlive their server")

    def forget(self, sandbox: S) -> None:
        """Another server of the fleet serves this sandbox now: stop following it (its
        end is no longer this server's news). Nothing by default."""
        return None

    async def adopt_checkpointed(self, session_id: str) -> S:
        """Take over a sandbox a previous server checkpointed (:meth:`restore` brings it
        back); SessionFailed when its checkpoint is gone or unusable."""
        raise SessionFailed(f"the {self.name} engine cannot hibernate sessions")

    async def release(self, sandbox: S) -> None:
        """Let go of a checkpointed sandbox at server shutdown, keeping its checkpoint for
        :meth:`adopt_checkpointed` by the next server."""
        await self.destroy(sandbox)

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        """Destroy what previous servers left of sessions not in ``keep``; their ids."""
        return []

    async def remove_left(self, session_id: str) -> None:
        """Destroy what a server that stopped left of one session's sandbox: its start or
        its removal was cut short, so the sandbox may be whole, half made or gone. By
        default the sandbox is adopted first; engines that can remove a half-made one
        by its session's name do so."""
        try:
            sandbox = await self.adopt(session_id)
        except SessionFailed:
            return
        await self.destroy(sandbox)

    # -- capabilities ----------------------------------------------------------------------

    async def freeze(self, sandbox: S) -> None:
        """Stop every process of the sandbox where it stands (:attr:`Capability.FREEZE`).

        Nothing reaches its agent until :meth:`thaw`; :meth:`destroy` works on it.
        """
        raise self.lacks(Capability.FREEZE, 'pause mode "freeze"')

    async def thaw(self, sandbox: S) -> None:
        raise self.lacks(Capability.FREEZE, "resume")

    async def checkpoint(self, sandbox: S) -> None:
        """Checkpoint the sandbox to disk and end its processes (pause "hibernate"). The
        caller has closed its agent stream: CRIU cannot dump one that leads out."""
        raise self.lacks(Capability.CHECKPOINT, 'pause mode "hibernate"')

    async def restore(self, sandbox: S) -> None:
        """Bring a checkpointed sandbox back; the caller then opens a new agent stream."""
        raise self.lacks(Capability.CHECKPOINT, "resume from hibernation")

    async def snapshot(self, sandbox: S, directory: Path, packed: bool = True) -> SnapshotInfo:
        """Checkpoint the running sandbox into the new ``directory``; it runs on. The
        caller has closed its agent stream and opens a new one after.

        ``packed``: compressed, to keep; else raw, for copies made at once (a fork).
        :meth:`create` with ``SessionSpec.from_snapshot`` makes a copy from it.
        """
        raise self.lacks(Capability.CHECKPOINT, "snapshots and forks")

    async def keep_for_restores(self, directory: Path) -> None:
        """The snapshot in ``directory`` is going to be restored often (a pool keeps copies
        of it): keep it in the form fastest to restore, until :meth:`kept_for_restores`
        is removed. Nothing by default."""

    def kept_for_restores(self, directory: Path) -> Path | None:
        """What :meth:`keep_for_restores` adds to the snapshot in ``directory`` (None:
        nothing). The session layer removes it once no pool keeps the snapshot, when no
        restore reads it: it is the snapshot's memory again, taking disk for nothing."""
        return None
