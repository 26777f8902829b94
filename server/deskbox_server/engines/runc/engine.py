"""The runc engine: sessions in runc sandboxes (sandbox.py) behind the Engine interface of
engines/base.py. Each sandbox's agent listens on a unix socket the host reaches through a
checked hard link (stream.py).

Freeze, checkpoints (hibernate, snapshots, forks) and egress modes are here too; what they
do to a sandbox is in freezer.py, criu.py, snapshot.py and ../network.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from typing import ClassVar

from ...errors import Internal, InvalidRequest
from ..base import AgentStream, Capability, Engine, SessionSpec, SnapshotInfo
from ..host_addresses import HostAddressWatch, start_host_watch
from ..image import ImageHold, build_off_loop
from ..in_thread import made_in_thread
from ..network import Egress, check_allow, resolve_egress
from ..processes import become_subreaper
from .criu import Criu, hibernate_sandbox, restore_sandbox
from .id_overlap import users_sharing_ids
from .kerndat import keep_kerndat_cache
from .layout import Limits
from .reach import check_image_reachable
from .sandbox import RuncOptions, RuncSandbox, remove_orphans
from .seccomp import seccomp_profile
from .snapshot import RAW_IMAGES, keep_unpacked, restore_copy, take_snapshot
from .stream import open_agent_stream

__all__ = ["RuncEngine"]


log = logging.getLogger("deskbox.runc")

class RuncEngine(Engine[RuncSandbox]):
    """Sessions in runc sandboxes made from the image ``options.rootfs``.

    The host never connects to a sandbox's X server: the agent inside drives it.
    """

    # "container" on the wire (API.md: a session's ``backend``).
    name: ClassVar[str] = "container"
    capabilities: frozenset[Capability] = frozenset(Capability)
    egress_modes: ClassVar[frozenset[str]] = frozenset({"none", "allowlist", "all"})

    def __init__(
        self,
        options: RuncOptions,
        image: Callable[[threading.Event], Path] | None = None,
        criu: Criu | None = None,
    ) -> None:
        """``image``, if given, finds or builds the session image (blocking; it stops when
        its event is set): :meth:`prepare` runs it and uses its result as ``options.rootfs``.
        """
        self.options = options
        self._image = image
        self._criu = criu or Criu()
        self._host_watch = HostAddressWatch(options.id_prefix)
        self._image_hold = ImageHold()

    async def prepare(self) -> None:
        # Before the image build, which takes minutes the first time: these would fail the
        # start after it, with a traceback.
        if os.geteuid() != 0:
            raise Internal(
                "the container engine needs root (runc sandboxes, their cgroups and "
                "network namespaces): run deskbox serve as root, or offer other backends "
                "(DESKBOX_BACKENDS=docker with rootless Podman, or local)")
        if shutil.which(self.options.runc.binary) is None:
            raise Internal("the container engine needs runc (Debian's runc; scripts/setup.sh "
                           "installs it)")
        # runc exits once a sandbox runs: its init must reparent to us, to be reaped.
        become_subreaper()
        # Refuse to serve at all without the syscall allowlist (Internal, naming its
        # package); every sandbox start reads it again, so a later loss fails that session.
        await asyncio.to_thread(seccomp_profile, self.options.seccomp_source)
        if self._criu.missing() is None:
            await asyncio.to_thread(keep_kerndat_cache, self._criu.wrapper)
        if self._image is not None:
            rootfs = await build_off_loop(self._image)
            self.options = dataclasses.replace(self.options, rootfs=rootfs)
        await asyncio.to_thread(check_image_reachable, self.options.rootfs)
        if self.options.user_ids is not None and (
                sharing := await asyncio.to_thread(users_sharing_ids, self.options.user_ids)):
            first, count = self.options.user_ids
            log.warning(
                "the sandboxes run as the host's ids %d-%d, which the host also grants to "
                "%s: that user can become them and reach every session; give it another "
                "range (usermod --del-subuids/--add-subuids)", first, first + count - 1,
                ", ".join(sharing))
        # Last: a prepare that failed leaves nothing behind.
        if self.options.scratch is not None:
            await asyncio.to_thread(self.options.scratch.open)
        await asyncio.to_thread(start_host_watch, self._host_watch)
        await asyncio.to_thread(self._image_hold.hold, self.options.rootfs)

    def check(self, spec: SessionSpec) -> None:
        super().check(spec)
        if spec.from_snapshot is not None and spec.volumes:
            raise InvalidRequest("a session made from a snapshot cannot mount volumes")
        if spec.network is not None:
            check_allow(spec.network.egress, spec.network.allow)
            if spec.from_snapshot is not None and spec.network.egress != "none":
                raise InvalidRequest(
                    "a session made from a snapshot has the snapshot's network (egress "
                    "\"none\"); leave network out"
                )

    async def create(self, spec: SessionSpec, timeout_s: float) -> RuncSandbox:
        limits = Limits()
        if spec.resources is not None:
            limits = Limits(spec.resources.cpus, spec.resources.memory_mb, spec.resources.pids)
        if spec.from_snapshot is not None:
            snapshot = spec.from_snapshot
            return await made_in_thread(lambda: restore_copy(
                self.options, spec.id, snapshot, self._criu, limits, timeout_s, spec.together,
            ), RuncSandbox.destroy)
        egress = Egress()
        if spec.network is not None and spec.network.egress != "none":
            # Host names of an allowlist are resolved here, on the host, once.
            egress = await asyncio.to_thread(
                resolve_egress, spec.network.egress, spec.network.allow
            )
        return await made_in_thread(lambda: RuncSandbox.start(
            self.options, spec.id, spec.desktop, limits, True, timeout_s, egress,
            not spec.background, spec.volumes,
        ), RuncSandbox.destroy)

    async def started(self, sandbox: RuncSandbox, timeout_s: float) -> None:
        await asyncio.to_thread(sandbox.apply_limits)

    async def open_stream(self, sandbox: RuncSandbox, read_limit: int) -> AgentStream:
        return await open_agent_stream(sandbox, read_limit)

    async def adopt(self, session_id: str) -> RuncSandbox:
        return await asyncio.to_thread(RuncSandbox.adopt, self.options, session_id)

    async def adopt_checkpointed(self, session_id: str) -> RuncSandbox:
        return await asyncio.to_thread(
            RuncSandbox.adopt_checkpointed, self.options, session_id
        )

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        return await asyncio.to_thread(remove_orphans, self.options, keep)

    async def stop(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.stop)

    async def kill(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.kill)

    async def destroy(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.destroy)

    async def release(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.release_host_side)

    async def freeze(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.freeze_own)

    async def thaw(self, sandbox: RuncSandbox) -> None:
        await asyncio.to_thread(sandbox.thaw_own)

    async def checkpoint(self, sandbox: RuncSandbox) -> None:
        """Checkpoint the sandbox into its session directory; its processes end."""
        await asyncio.to_thread(sandbox.pin_inner_display)
        with sandbox.frozen_for_a_while():
            stats = await asyncio.to_thread(hibernate_sandbox, sandbox, self._criu)
        await asyncio.to_thread(sandbox.release_init)
        sandbox.timings["hibernate"] = stats.seconds

    async def restore(self, sandbox: RuncSandbox) -> None:
        with sandbox.frozen_for_a_while():
            sandbox.timings["restore"] = await asyncio.to_thread(
                restore_sandbox, sandbox, self._criu
            )

    async def snapshot(
        self, sandbox: RuncSandbox, directory: Path, packed: bool = True
    ) -> SnapshotInfo:
        with sandbox.frozen_for_a_while():
            stats = await asyncio.to_thread(
                take_snapshot, sandbox, self._criu, directory, packed)
        return SnapshotInfo(stats.seconds, stats.raw_bytes, stats.compressed_bytes)

    async def keep_for_restores(self, directory: Path) -> None:
        await asyncio.to_thread(keep_unpacked, directory)

    def kept_for_restores(self, directory: Path) -> Path | None:
        return directory / RAW_IMAGES

    async def close(self) -> None:
        self._image_hold.release()
        await asyncio.to_thread(self._host_watch.close)
        if self.options.scratch is not None:
            await asyncio.to_thread(self.options.scratch.close)
