"""The ``docker`` engine: each session a container of the session image's OCI form, made
through the Docker Engine API (Docker, or Podman's compatible service), over one kept
client (daemon.py).

The container runs the session image's own init and agent, as a runc sandbox or a VM
guest does; the engine starts it and hands the session layer one stream to the agent, a
unix socket in a host directory the container mounts (agent_socket.py). Pause is the
engine's pause (the cgroup freezer). Checkpoints are refused: the Engine API has them only
as an experimental Docker feature. Egress is ``none`` only (no network device but
loopback): the Engine API cannot say "these addresses and nothing else".

One watcher per engine lists the server's containers every few seconds, so that a
container that stopped on its own (its init exited, the daemon killed it) fails its
session with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import shutil
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ...errors import DeskboxError, Internal, SessionFailed, Timeout
from ..base import AgentStream, Capability, Engine, SessionSpec
from ..exit_note import exit_note
from ..image import OCI_ARCHIVE, build_off_loop
from ..in_thread import answered
from ..runc.displays import mount_tmpfs, unmount
from ..runc.seccomp import PODMAN_PROFILE, SeccompProfile, seccomp_profile
from .agent_socket import agent_socket_ready, connect_agent
from .cgroups import Limit
from .daemon import Daemon, DaemonRefused
from .sandbox import DockerSandbox, server_tag
from .spec import (
    AGENT_SOCKET,
    LABEL_SERVER,
    LABEL_SESSION,
    ContainerLimits,
    container_body,
    cpu_update,
)

__all__ = ["DockerEngine", "DockerOptions"]

log = logging.getLogger("deskbox.docker")
_WATCH_INTERVAL_S = 2.0
_SOCKET_POLL_S = 0.02
_INSPECT_EVERY_S = 0.5
_HEALTH_TIMEOUT_S = 2.0  # GET /healthz: how long the daemon may take to answer
# As the runc engine's shared directory: the agent's socket and the init's exit note.
_SOCKET_DIR_TMPFS = "size=256k,nr_inodes=64,mode=0755"


@dataclass(frozen=True)
class DockerOptions:
    url: str  # the Engine API: unix:///var/run/docker.sock, unix:///run/podman/podman.sock
    state_dir: Path
    max_execs: int = 8
    seccomp_source: Path = PODMAN_PROFILE
    # The image to run; None: the one ``image`` (DockerEngine) finds or builds, loaded into
    # the daemon by prepare().
    image: str | None = None


class DockerEngine(Engine[DockerSandbox]):
    name: ClassVar[str] = "docker"
    capabilities: frozenset[Capability] = frozenset(
        {Capability.FREEZE, Capability.EXEC, Capability.RESOURCES, Capability.ADOPT})
    egress_modes: ClassVar[frozenset[str]] = frozenset({"none"})
    hint: ClassVar[str] = ("the container and vm backends have it (hibernate, snapshots and "
                           "forks; egress allowlist and all)")
    create_cancellable: ClassVar[bool] = True

    def __init__(self, options: DockerOptions,
                 image: Callable[[threading.Event], Path] | None = None) -> None:
        """``image``, if given, finds or builds the OCI image (blocking; it stops when its
        event is set); prepare() loads it into the daemon unless the daemon has it."""
        self.options = options
        self._image_builder = image
        self.image = options.image or ""
        self.daemon = Daemon(options.url)
        self.tag = server_tag(options.state_dir)
        self._seccomp: str | SeccompProfile = ""
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._watcher: asyncio.Task[None] | None = None

    def describe(self) -> dict[str, str]:
        details = {"engine_api": self.options.url, "daemon": f"{self.daemon.product} "
                   f"{self.daemon.version}".strip(), "image": self.image}
        cgroups = self.daemon.cgroups
        details["limits"] = cgroups.describe()
        if self.daemon.rootless:
            details["rootless"] = ("yes, on cgroup v1: no limits and no pause"
                                   if self.daemon.rootless_on_cgroup_v1 else "yes")
        return details

    async def problem(self) -> str | None:
        try:
            async with asyncio.timeout(_HEALTH_TIMEOUT_S):
                await self.daemon.answers()
        except DeskboxError as error:
            return error.message
        except TimeoutError:
            return (f"the container engine at {self.options.url} did not answer within "
                    f"{_HEALTH_TIMEOUT_S:g} s")
        return None

    async def prepare(self) -> None:
        profile = await asyncio.to_thread(seccomp_profile, self.options.seccomp_source)
        await self.daemon.open()
        self._fit_to_cgroups()
        if self.daemon.is_podman:
            # Podman's compatible API takes a path on its host where Docker takes the JSON.
            path = self.options.state_dir / "docker" / "seccomp.json"
            await asyncio.to_thread(_write_private, path, json.dumps(profile))
            self._seccomp = str(path)
        else:
            self._seccomp = profile
        if self._image_builder is not None:
            await self._load_image(self._image_builder)
        if not self.image:
            raise Internal("the docker engine has no image to run")
        self._watcher = asyncio.create_task(self._watch(), name="deskbox-docker-watch")

    def _fit_to_cgroups(self) -> None:
        """Declare only what the daemon's cgroups hold: a session asking for ``resources``
        or a pause it cannot enforce is refused (422), and the others run without what is
        missing (the daemon would drop it, at most with a warning)."""
        cgroups = self.daemon.cgroups
        lacking = {Capability.RESOURCES} if cgroups.missing else set()
        lacking |= set() if cgroups.freezer else {Capability.FREEZE}
        if lacking:
            self.capabilities = self.capabilities - lacking
            refused = " and ".join(sorted(("pause" if c is Capability.FREEZE else c.value)
                                          for c in lacking))
            log.warning("the container engine at %s: sessions get %s; %s refused",
                        self.options.url, cgroups.describe(), refused)

    async def _load_image(self, builder: Callable[[threading.Event], Path]) -> None:
        built = await build_off_loop(builder)
        manifest = json.loads(await asyncio.to_thread((built / "manifest.json").read_text))
        self.image = str(manifest["name"])
        if await self.daemon.has_image(self.image):
            return
        log.info("loading %s into %s %s", self.image, self.daemon.product, self.options.url)
        started = time.monotonic()
        await self.daemon.load_image(built / OCI_ARCHIVE, log.info)
        if not await self.daemon.has_image(self.image):
            raise Internal(f"the container engine loaded {built / OCI_ARCHIVE} but has no "
                           f"image {self.image}")
        log.info("%s loaded in %.1f s", self.image, time.monotonic() - started)

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self.daemon.close()

    # -- start and stop --------------------------------------------------------------------

    async def create(self, spec: SessionSpec, timeout_s: float) -> DockerSandbox:
        sandbox = DockerSandbox(self.options.state_dir, self.options.max_execs, spec.id)
        limits = _limits(spec)
        # As on the runc engine: the start-up runs at the host's full CPU, and the session's
        # quota applies once its desktop is ready (started). Under a small quota from the
        # start, Chromium did not paint within the start's timeout (cpus 0.01: a 504).
        # Desktops of the warm pool (background) start at their quota: they must not slow
        # the sessions that run.
        held = self.daemon.cgroups.limits
        boost = Limit.CPU in held and self.daemon.updates_limits and not spec.background
        started = time.monotonic()
        try:
            await asyncio.to_thread(_make_socket_dir, sandbox.socket_dir)
            body = container_body(
                self.image, spec.desktop, sandbox.socket_dir, limits, self._seccomp,
                {LABEL_SESSION: spec.id, LABEL_SERVER: self.tag},
                bind_flags=self.daemon.is_podman, held=held, boost=boost,
                rootless=self.daemon.rootless)
            # Cancelled midway (a delete of the starting session), the daemon made the
            # container all the same, after destroy had found none of its name to remove.
            sandbox.container_id = await answered(self.daemon.create(sandbox.name, body))
            self._sandboxes[spec.id] = sandbox
            await self.daemon.start(sandbox.container_id)
            sandbox.timings["container_started"] = time.monotonic() - started
            await self._wait_for_agent(sandbox, started + timeout_s)
        except BaseException:
            await asyncio.shield(self.destroy(sandbox))
            raise
        sandbox.timings["agent_ready"] = time.monotonic() - started
        sandbox.pending_quota = limits if boost else None
        return sandbox

    async def started(self, sandbox: DockerSandbox, timeout_s: float) -> None:
        limits, sandbox.pending_quota = sandbox.pending_quota, None
        if limits is not None and sandbox.container_id is not None:
            await self.daemon.update(sandbox.container_id,
                                     cpu_update(limits, self.daemon.is_podman,
                                                self.daemon.cgroups.limits))

    async def _wait_for_agent(self, sandbox: DockerSandbox, deadline: float) -> None:
        assert sandbox.container_id is not None
        next_inspect = 0.0
        while not agent_socket_ready(sandbox.socket_dir, AGENT_SOCKET):
            now = time.monotonic()
            if now > deadline:
                raise Timeout(f"{sandbox.label}'s agent did not listen in time")
            if now >= next_inspect:
                next_inspect = now + _INSPECT_EVERY_S
                if (ended := _ended(await self.daemon.inspect(sandbox.container_id))):
                    raise SessionFailed(f"{sandbox.label} {ended} before its agent listened")
            await asyncio.sleep(_SOCKET_POLL_S)

    async def open_stream(self, sandbox: DockerSandbox, read_limit: int) -> AgentStream:
        if sandbox.ended is not None:
            raise SessionFailed(f"{sandbox.label} {sandbox.ended}")
        return await connect_agent(sandbox.socket_dir, AGENT_SOCKET, read_limit)

    async def kill(self, sandbox: DockerSandbox) -> None:
        if sandbox.container_id is None:
            return
        try:
            await self.daemon.kill(sandbox.container_id)
        except DaemonRefused:
            # Podman refuses to kill what no longer runs (500, "container state improper").
            if _ended(await self.daemon.inspect(sandbox.container_id)) is None:
                raise

    async def destroy(self, sandbox: DockerSandbox) -> None:
        self._sandboxes.pop(sandbox.session_id, None)
        try:
            await self.daemon.remove(sandbox.container_id or sandbox.name)
        except DaemonRefused as error:
            # Never raised for a dead sandbox: what is left goes at the next orphan sweep.
            log.warning("removing %s: %s", sandbox.label, error)
        # A daemon that does not answer raises (SessionFailed): the container may run on,
        # and the session says so; the next start's orphan sweep removes it.
        await asyncio.to_thread(_remove_socket_dir, sandbox.socket_dir)

    async def adopt(self, session_id: str) -> DockerSandbox:
        sandbox = DockerSandbox(self.options.state_dir, self.options.max_execs, session_id)
        found = await self.daemon.inspect(sandbox.name)
        if found is None:
            raise SessionFailed(f"{sandbox.label} is gone")
        if (ended := _ended(found)) is not None:
            raise SessionFailed(f"{sandbox.label} {ended}")
        labels = (found.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_SESSION) != session_id or labels.get(LABEL_SERVER) != self.tag:
            raise SessionFailed(f"{sandbox.label} is not this server's")
        sandbox.container_id = str(found["Id"])
        if not await asyncio.to_thread(agent_socket_ready, sandbox.socket_dir, AGENT_SOCKET):
            raise SessionFailed(f"{sandbox.label}'s agent socket is gone")
        if (found.get("State") or {}).get("Paused"):
            # Only running sessions are adopted: a pause their record does not know of (the
            # previous server was killed before it recorded its pause, or someone paused
            # the container meanwhile). Its agent would not answer the handshake.
            log.warning("session %s: unpausing %s, paused while no server ran", session_id,
                        sandbox.label)
            await self.daemon.unpause(sandbox.container_id)
        self._sandboxes[session_id] = sandbox
        return sandbox

    def forget(self, sandbox: DockerSandbox) -> None:
        if self._sandboxes.get(sandbox.session_id) is sandbox:
            del self._sandboxes[sandbox.session_id]

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        removed, left = [], set()
        for found in await self.daemon.list_labelled(f"{LABEL_SERVER}={self.tag}"):
            session_id = str((found.get("Labels") or {}).get(LABEL_SESSION, ""))
            if session_id in keep or session_id in self._sandboxes:
                continue
            try:
                await self.daemon.remove(str(found["Id"]))
            except DaemonRefused as refused:
                # Not a reason to stop the server's start (it would stop every start: the
                # container is listed again each time); the next start tries it again.
                log.warning("orphaned container of session %s not removed: %s", session_id,
                            refused.message)
                left.add(session_id)
                continue
            removed.append(session_id)
        # Socket directories of containers that are gone.
        root = self.options.state_dir / "docker"
        for entry in await asyncio.to_thread(_subdirectories, root):
            if entry.name not in {*keep, *left} and entry.name not in self._sandboxes:
                await asyncio.to_thread(_remove_socket_dir, entry)
        return removed

    # -- capabilities ----------------------------------------------------------------------

    async def freeze(self, sandbox: DockerSandbox) -> None:
        assert sandbox.container_id is not None
        # Ours from before the daemon's pause: a listing then must not call it someone
        # else's.
        sandbox.frozen = True
        sandbox.pause_changes += 1
        try:
            await self.daemon.pause(sandbox.container_id)
        except BaseException:
            sandbox.frozen = False
            raise

    async def thaw(self, sandbox: DockerSandbox) -> None:
        assert sandbox.container_id is not None
        sandbox.pause_changes += 1
        try:
            await self.daemon.unpause(sandbox.container_id)
        except DaemonRefused:
            # Unpaused behind the server's back: it runs, as the thaw would have left it.
            state = ((await self.daemon.inspect(sandbox.container_id)) or {}).get("State") or {}
            if state.get("Paused") or not state.get("Running"):
                raise
            log.warning("session %s: %s was unpaused outside the server", sandbox.session_id,
                        sandbox.label)
        sandbox.frozen = False

    # -- the watcher -----------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCH_INTERVAL_S)
            if self._sandboxes:
                await self.look_at_containers()

    async def look_at_containers(self) -> None:
        """One round of the watcher: a listing of the server's containers, and what it says
        of each sandbox's."""
        pause_changes = {sid: s.pause_changes for sid, s in self._sandboxes.items()}
        # Only containers made before the listing began must be in it: one created
        # meanwhile (a session starting) is judged at the next round.
        created = {sid: s.container_id for sid, s in self._sandboxes.items()}
        try:
            listed = await self.daemon.list_labelled(f"{LABEL_SERVER}={self.tag}")
        except DeskboxError as error:
            log.warning("listing the containers: %s", error)
            return
        states = {str(found["Id"]): str(found.get("State", "")) for found in listed}
        for sandbox in list(self._sandboxes.values()):
            if (sandbox.container_id is None or sandbox.ended is not None
                    or created.get(sandbox.session_id) != sandbox.container_id):
                continue
            state = states.get(sandbox.container_id)
            if state is None:
                sandbox.ended = "was removed by someone else"
            elif state not in ("created", "running", "paused"):
                why = await asyncio.to_thread(exit_note, sandbox.socket_dir)
                sandbox.ended = f"stopped ({state})" + (f" (its init: {why})" if why else "")
            elif pause_changes.get(sandbox.session_id) == sandbox.pause_changes:
                _note_held(sandbox, state == "paused" and not sandbox.frozen)


def _note_held(sandbox: DockerSandbox, held: bool) -> None:
    """The watcher saw the container paused by someone else (or no longer)."""
    if held and sandbox.held_outside is None:
        log.warning("session %s: %s was paused outside the server", sandbox.session_id,
                    sandbox.label)
        sandbox.held_outside = (
            f"{sandbox.label} was paused outside Deskbox (docker or podman pause): "
            "unpause it, and the session goes on")
    elif not held and sandbox.held_outside is not None:
        log.info("session %s: %s runs again", sandbox.session_id, sandbox.label)
        sandbox.held_outside = None


def _limits(spec: SessionSpec) -> ContainerLimits:
    """The session's limits; its open files at most the hard limit this process has, which
    a daemon on the same host started alike has too (above it the runtime fails the start:
    raising needs CAP_SYS_RESOURCE)."""
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    if spec.resources is None:
        return ContainerLimits(nofile=nofile)
    return ContainerLimits(cpus=spec.resources.cpus, memory_mb=spec.resources.memory_mb,
                           pids=spec.resources.pids, nofile=nofile)


def _ended(inspected: dict[str, Any] | None) -> str | None:
    """Why a container no longer runs (from its inspect document), or None if it runs."""
    if inspected is None:
        return "is gone"
    state = inspected.get("State") or {}
    if state.get("Running") or state.get("Paused"):
        return None
    if state.get("OOMKilled"):
        return "ran out of memory"
    if str(state.get("Status", "")) == "created":
        return None
    return f"exited (status {state.get('ExitCode')})"


def _make_socket_dir(path: Path) -> None:
    """The session's socket directory: the one host path its container writes, so a small
    tmpfs of its own where the server may mount one (as root); a plain directory on the
    state dir's disk, which a session could fill, was all a container needed to do so."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)  # no other host user reaches a session's sockets
    _remove_socket_dir(path)
    path.mkdir(mode=0o755)
    if os.geteuid() == 0:
        mount_tmpfs(path, _SOCKET_DIR_TMPFS)


def _remove_socket_dir(path: Path) -> None:
    unmount(path)
    shutil.rmtree(path, ignore_errors=True)


def _subdirectories(root: Path) -> list[Path]:
    try:
        return [entry for entry in root.iterdir() if entry.is_dir()]
    except FileNotFoundError:
        return []


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)
