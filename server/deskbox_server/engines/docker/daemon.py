"""The docker engine's one kept connection to an Engine API: Docker's, or Podman's
compatible service (``podman system service``), through aiodocker.

Only the calls the engine makes, each mapped onto our errors: a refusal names what the
daemon said (:class:`DaemonRefused`), and a daemon that does not answer is an Internal error
naming its address and how to start one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiodocker
import aiohttp
from aiodocker.exceptions import DockerError

from ...errors import DeskboxError, Internal, SessionFailed, UpstreamRefused
from .cgroups import Cgroups, read_cgroups, rootless_on_cgroup_v1

__all__ = ["Daemon", "DaemonRefused"]

log = logging.getLogger("deskbox.docker")
T = TypeVar("T")
_LOAD_CHUNK = 4 * 1024 * 1024
_UNREACHABLE = 900  # aiodocker's status for a connection that failed
# A daemon that accepts connections and never answers (a storage lock held, the service
# stopped with SIGSTOP) would hold a create, and the delete and shutdown that wait for
# it, for ever: aiodocker's client has no timeout of its own. Removing a container stops
# its processes first (Podman waits up to 10 s for them).
_CALL_TIMEOUT_S = 60.0
_LOAD_TIMEOUT_S = 1800.0  # the session image, ~1 GB, streamed


def _socket_owner(url: str) -> int | None:
    """The uid of the process serving a ``unix://`` Engine API socket (None: not a unix
    socket, or no answer)."""
    if not url.startswith("unix://"):
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.settimeout(5.0)
            probe.connect(url.removeprefix("unix://"))
            credentials = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                           struct.calcsize("3i"))
        except OSError:
            return None
    _, uid, _ = struct.unpack("3i", credentials)
    return int(uid)


class DaemonRefused(UpstreamRefused):
    """The Engine API answered with an error status."""

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__("the container engine", what, status, message)


class Daemon:
    def __init__(self, url: str) -> None:
        self.url = url
        self._docker: aiodocker.Docker | None = None
        self.product = ""  # "Docker Engine", "Podman Engine"
        self.version = ""
        self.rootless = False  # the daemon runs as an ordinary user (rootless Podman, Docker)
        self.cgroup_version = ""  # "1", "2"
        # What its containers' cgroups enforce (limits) and whether it can pause one: read
        # from its info at open(); until then, everything.
        self.cgroups = Cgroups()

    @property
    def is_podman(self) -> bool:
        return self.product.startswith("Podman")

    @property
    def _api(self) -> aiodocker.Docker:
        if self._docker is None:
            raise Internal("the docker engine is not prepared")
        return self._docker

    async def open(self) -> None:
        self._docker = aiodocker.Docker(url=self.url)
        try:
            version = await self._call("tell its version", self._api.version())
            info = await self._call("tell what it runs on", self._api.system.info())
            product = str((version.get("Components") or [{}])[0].get("Name", "Docker Engine"))
            podman_info = (await self._podman_info() if product.startswith("Podman")
                           else None)
        except BaseException:
            await self.close()
            raise
        self.product = product
        self.version = str(version.get("Version", ""))
        options = [str(option) for option in info.get("SecurityOptions") or []]
        # Docker says so in its SecurityOptions, Podman 4.3's compatible info in a field of
        # its own; either way the socket's other end is then an ordinary user's process.
        self.rootless = (any(option.split(",")[0] == "name=rootless" for option in options)
                         or info.get("Rootless") is True
                         or await asyncio.to_thread(_socket_owner, self.url) not in (None, 0))
        self.cgroup_version = str(info.get("CgroupVersion", ""))
        self.cgroups = read_cgroups(info, self.rootless, podman_info, self.is_podman)

    async def _podman_info(self) -> dict[str, Any] | None:
        """Podman's own info (its cgroup controllers), or None where it has none to give."""
        try:
            answer = await self._call("tell its cgroup controllers",
                                      self._api._query_json("libpod/info"))
        except DaemonRefused as refused:
            log.warning("the container engine at %s: %s", self.url, refused.message)
            return None
        return answer if isinstance(answer, dict) else None

    async def answers(self) -> None:
        """Nothing if the daemon answers a cheap question; else why not (DeskboxError)."""
        await self._call("tell its version", self._api.version())

    @property
    def updates_limits(self) -> bool:
        """Whether a running container's limits can be changed: Docker's update; Podman's
        own (libpod) update came with Podman 4.3, and its compatible API has none."""
        if not self.is_podman:
            return True
        try:
            major, minor = (int(part) for part in self.version.split(".")[:2])
        except ValueError:
            return False
        return (major, minor) >= (4, 3)

    @property
    def rootless_on_cgroup_v1(self) -> bool:
        """No cgroup for a container at all (cgroups.py's first rule)."""
        return rootless_on_cgroup_v1(self.rootless, self.cgroup_version)

    async def close(self) -> None:
        if self._docker is not None:
            docker, self._docker = self._docker, None
            await docker.close()

    async def _call(self, what: str, call: Awaitable[T], timeout_s: float | None = None) -> T:
        timeout_s = timeout_s or _CALL_TIMEOUT_S
        try:
            async with asyncio.timeout(timeout_s):
                return await call
        except TimeoutError:
            raise self._unreachable(f"no answer to '{what}' within {timeout_s:g} s") from None
        except DockerError as error:
            if error.status == _UNREACHABLE:
                raise self._unreachable(error.message) from None
            raise DaemonRefused(what, error.status, str(error.message)) from None
        except (aiohttp.ClientError, OSError) as error:
            raise self._unreachable(error) from None

    def _unreachable(self, detail: object) -> DeskboxError:
        """At the server's start the server cannot serve (Internal); later, the call's
        session fails (502) and the server goes on."""
        message = (
            f"the container engine at {self.url} does not answer ({detail}); start Docker or "
            "Podman's compatible service (`podman system service`) and point "
            "DESKBOX_DOCKER_HOST at its socket"
        )
        return SessionFailed(message) if self.product else Internal(message)

    # -- images -----------------------------------------------------------------------------

    async def has_image(self, name: str) -> bool:
        try:
            await self._call("inspect an image", self._api.images.inspect(name))
        except DaemonRefused as refused:
            if refused.upstream_status == 404:
                return False
            raise
        return True

    async def load_image(self, archive: Path, progress: Callable[[str], None]) -> None:
        """``POST /images/load`` of an image archive, streamed from the file."""

        size = max(1, (await asyncio.to_thread(archive.stat)).st_size)
        file = await asyncio.to_thread(archive.open, "rb")

        async def chunks() -> AsyncIterator[bytes]:
            sent = reported = 0
            with file:
                while chunk := await asyncio.to_thread(file.read, _LOAD_CHUNK):
                    sent += len(chunk)
                    if sent - reported >= size // 5 or sent == size:
                        reported = sent
                        progress(f"loading {archive.name} into the container engine: "
                                 f"{sent * 100 // size} %")
                    yield chunk

        answers = await self._call("load the session image",
                                   self._api.images.import_image(data=chunks()),
                                   _LOAD_TIMEOUT_S)
        for answer in answers or ():
            if isinstance(answer, dict) and answer.get("error"):
                raise DaemonRefused("load the session image", 500, str(answer["error"]))

    # -- containers -------------------------------------------------------------------------

    async def create(self, name: str, body: dict[str, Any]) -> str:
        container = await self._call("create a container",
                                     self._api.containers.create(body, name=name))
        return str(container.id)

    def _container(self, container: str) -> aiodocker.containers.DockerContainer:
        return aiodocker.containers.DockerContainer(self._api, id=container)

    async def start(self, container: str) -> None:
        await self._call("start a container", self._container(container).start())

    async def update(self, container: str, body: dict[str, Any]) -> None:
        """Change a running container's limits (spec.py's ``cpu_update`` says the body)."""
        path = f"{'libpod/' * self.is_podman}containers/{container}/update"
        await self._call("change a container's limits", self._post(path, body))

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        async with self._api._query(path, method="POST", data=json.dumps(body)):
            pass

    async def pause(self, container: str) -> None:
        await self._call("pause a container", self._container(container).pause())

    async def unpause(self, container: str) -> None:
        await self._call("resume a container", self._container(container).unpause())

    async def kill(self, container: str) -> None:
        """SIGKILL to every process; quiet when it is gone or not running."""
        try:
            await self._call("kill a container",
                             self._container(container).kill(signal="SIGKILL"))
        except DaemonRefused as refused:
            if refused.upstream_status not in (404, 409):
                raise

    async def remove(self, container: str) -> None:
        """Force-remove with its anonymous volumes; quiet when it is gone already."""
        try:
            await self._call("remove a container",
                             self._container(container).delete(force=True, v=True))
        except DaemonRefused as refused:
            if refused.upstream_status != 404:
                raise

    async def inspect(self, container: str) -> dict[str, Any] | None:
        """The container's inspect document, or None when there is no such container."""
        try:
            return await self._call("inspect a container", self._container(container).show())
        except DaemonRefused as refused:
            if refused.upstream_status == 404:
                return None
            raise

    async def list_labelled(self, label: str) -> list[dict[str, Any]]:
        """Every container (running or not) with ``label`` (``key=value``)."""
        found = await self._call("list containers", self._api.containers.list(
            all="true", filters=json.dumps({"label": [label]})))
        return [dict(container._container) for container in found]
