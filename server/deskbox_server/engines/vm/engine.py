"""The ``vm`` engine: each session in a QEMU microVM with its own guest kernel.

A container shares the host's kernel, and one kernel bug is enough to leave it; a VM
session runs its own kernel (Debian's) behind QEMU. The guest runs the same session image
and the same agent as a container: the engine only starts QEMU and hands the session
layer one stream to the agent, QEMU's virtio-serial port behind a unix socket.

Freeze is QMP ``stop``/``cont``. Checkpoints are QEMU's migration stream written to a
file: hibernation keeps it in the session's state directory, a snapshot in the snapshot's
directory, and every restore (a fork's copies included) starts a new QEMU reading it. The
guest's root is the read-only image and its writable paths are tmpfs, all of it in the
guest's RAM, so each restored copy owns its whole writable state and no disk overlay is
needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import ClassVar, Literal

from ...errors import (
    NO_ROOM,
    CheckpointUnavailable,
    Conflict,
    DeskboxError,
    DesktopFailed,
    InsufficientStorage,
    Internal,
    InvalidRequest,
    SessionFailed,
    Timeout,
)
from ..base import AgentStream, Capability, CpusFloor, Engine, SessionSpec, SnapshotInfo
from ..desktop_commands import session_env
from ..host_addresses import HostAddressWatch, start_host_watch
from ..image import ImageHold, build_off_loop
from ..network import (
    Egress,
    SessionNetwork,
    check_allow,
    hosts_file,
    resolv_conf,
    resolve_egress,
)
from ..own_desktop import OWN_DISPLAY, OWN_HOME
from .accel import Accelerator, detect_accelerator
from .copies import copy_config
from .guest import (
    VmGuest,
    in_thread_to_the_end,
    kill_leftover,
    leftover_pid,
    start_guest,
)
from .jail import UidPool, jail_argv
from .qemu import AGENT_PORT, GuestImage, VmConfig, VmVolume
from .qmp import QmpClient
from .runtime_files import empty, mount_runtime, remove_runtime, socket_address
from .sandbox import (
    CONFIG_FILE,
    HIBERNATION_FILE,
    VmSandbox,
    runtime_root,
)

__all__ = ["VmEngine"]

log = logging.getLogger("deskbox.vm")

AGENT_ARGV = ("/usr/local/bin/deskbox-agent", "--listen",
              f"serial:/dev/virtio-ports/{AGENT_PORT}")
# Under TCG the guest's Chromium re-reads a changed keymap and draws typed keys 10-30 times
# slower than on a host: the agent waits that much longer for it before moving on.
_TCG_AGENT_PATIENCE = 10
_SAVE_TIMEOUT_S = 300.0
# The least resources.cpus of a guest once ready. Under TCG, measured through the API on
# 2 cores (docs/API.md): a lone screenshot took 0.2-1.1 s at 0.25, about 1 s at 0.1 (its
# first 2.8 s) and 9-19 s at 0.03, near a call's 30 s timeout, which fails the session. A
# click with its settled screenshot, or a busier host, multiplies 0.1's seconds; 0.25
# keeps a look near a second.
TCG_FLOOR = CpusFloor(0.25, "its VMs run under software emulation (TCG), where less CPU "
                            "makes a screenshot take seconds, near a call's timeout")
# Under KVM the guest runs at the host's speed: its own kernel and QEMU's devices ask a
# little more than a container's desktop (not measured: no usable KVM on this project's
# hosts).
KVM_FLOOR = CpusFloor(0.05, "a VM's own kernel and QEMU's devices need a share of their own")


class VmEngine(Engine[VmSandbox]):
    """Sessions in QEMU microVMs made from the guest ``image`` builds (or finds cached)."""

    name: ClassVar[str] = "vm"
    capabilities: frozenset[Capability] = frozenset(
        {Capability.FREEZE, Capability.CHECKPOINT, Capability.EXEC, Capability.RESOURCES,
         Capability.ADOPT, Capability.VOLUMES}
    )
    egress_modes: ClassVar[frozenset[str]] = frozenset({"none", "allowlist", "all"})
    hint: ClassVar[str] = "use the container engine (\"backend\": \"container\") for it"
    # Under software emulation a guest's Chromium paints its first page after about a
    # minute on this project's 2-core hosts; with KVM in seconds.
    start_timeout_floor_s: ClassVar[float] = 180.0
    handshake_timeout_s: ClassVar[float] = 30.0
    create_cancellable: ClassVar[bool] = True  # _boot_new destroys what a cancel interrupts
    stream_ends_with_agent: ClassVar[bool] = False  # see _agent_let_go

    def __init__(
        self,
        state_dir: Path,
        image: Callable[[threading.Event], Path],
        accelerator: Literal["auto", "kvm", "tcg"] = "auto",
        max_execs: int = 8,
        *,
        browser: bool = True,
    ) -> None:
        """``image`` finds or builds the guest (blocking; it stops when its event is set)
        and returns its directory (``images/vm-<hash>/``); ``max_execs``: commands and file
        transfers one session may run at once. ``browser=False`` boots guests without one
        (as the container engine's ``RuncSandbox.start`` can): a desktop that does not talk
        to the network on its own, for egress tests with the whole network open."""
        self.state_dir = state_dir.resolve()
        self._image_source = image
        self._wanted_accelerator = accelerator
        self._image: GuestImage | None = None
        self._accelerator: Accelerator | None = None
        self._uids = UidPool()
        self._max_execs = max_execs
        self._browser = browser
        self._host_watch = HostAddressWatch("deskbox-vm-")  # any server's VMs: no harm
        self._image_hold = ImageHold()

    @property
    def accelerator(self) -> Accelerator:
        if self._accelerator is None:
            self._accelerator = detect_accelerator(self._wanted_accelerator)
        return self._accelerator

    def least_cpus(self) -> CpusFloor:
        return KVM_FLOOR if self.accelerator.name == "kvm" else TCG_FLOOR

    def describe(self) -> dict[str, str]:
        accelerator = self.accelerator
        # Said before a create is refused for it: the floor depends on the accelerator.
        return {"accelerator": accelerator.name, "accelerator_reason": accelerator.reason,
                "least_cpus": f"{self.least_cpus().cpus:g}"}

    async def prepare(self) -> None:
        # Before the guest's build, which takes minutes the first time.
        if os.geteuid() != 0:
            raise Internal("the vm engine needs root (QEMU runs jailed in namespaces and "
                           "cgroups of its own): run deskbox serve as root, or leave vm out "
                           "of DESKBOX_BACKENDS")
        if shutil.which("qemu-system-x86_64") is None:
            raise Internal("the vm engine needs qemu-system-x86_64 (Debian's "
                           "qemu-system-x86; scripts/setup.sh installs it)")
        accelerator = self.accelerator
        log.info("vm engine: %s (%s)", accelerator.name, accelerator.reason)
        directory = await build_off_loop(self._image_source)
        self._image = GuestImage.from_directory(directory)
        await asyncio.to_thread(start_host_watch, self._host_watch)
        await asyncio.to_thread(self._image_hold.hold, self._image.root_disk)

    @property
    def image(self) -> GuestImage:
        if self._image is None:
            raise SessionFailed("the vm engine has no guest image (prepare() did not run)")
        return self._image

    def check(self, spec: SessionSpec) -> None:
        super().check(spec)
        if spec.network is not None:
            check_allow(spec.network.egress, spec.network.allow)
        if spec.network is not None and spec.from_snapshot is not None:
            raise InvalidRequest("a session made from a snapshot has the snapshot's network "
                                 "(egress \"none\"); leave network out")
        if spec.from_snapshot is not None and spec.resources is not None:
            # Blocking (a small file): the session layer calls check off the event loop.
            copy_config(_read_config(spec.from_snapshot), spec.resources)

    # -- start and stop --------------------------------------------------------------------

    async def create(self, spec: SessionSpec, timeout_s: float) -> VmSandbox:
        if spec.from_snapshot is not None:
            return await self._restore_copy(spec, spec.from_snapshot, timeout_s)
        config = VmConfig()
        if spec.resources is not None:
            cpus = spec.resources.cpus
            config = VmConfig(cpus=max(1, math.ceil(cpus)), cpu_quota=cpus,
                              memory_mb=spec.resources.memory_mb, pids=spec.resources.pids)
        egress = Egress()
        if spec.network is not None and spec.network.egress != "none":
            # Host names of an allowlist are resolved here, on the host, once.
            egress = await asyncio.to_thread(resolve_egress, spec.network.egress,
                                             spec.network.allow)
            config = dataclasses.replace(config, egress=egress.mode)
        if spec.volumes:
            config = dataclasses.replace(config, volumes=tuple(
                VmVolume(str(v.disk), v.path, v.read_only) for v in spec.volumes))
        sandbox = VmSandbox(self.state_dir, self._max_execs, spec.id, config)
        # As on the container engines: under its own quota from QEMU's start, a guest at
        # cpus 0.1 did not paint within its start's timeout (a TCG boot takes a minute or
        # two of CPU). A warm pool's guests boot at their quota: they must not slow the
        # sessions that run.
        sandbox.boosted = not spec.background
        sandbox.egress = egress
        sandbox.env = {
            "HOME": OWN_HOME,
            **session_env(spec.desktop, OWN_DISPLAY, self._agent_argv(), self._browser),
        }
        await self._boot_new(sandbox, timeout_s, None)
        return sandbox

    async def started(self, sandbox: VmSandbox, timeout_s: float) -> None:
        """A new guest's desktop is ready, or a restored one's agent answers again: QEMU
        gets the session's CPU quota (it booted or restored at the host's full CPU)."""
        if sandbox.boosted:
            await asyncio.to_thread(sandbox.cgroup.set_cpus, sandbox.config.cpu_quota)
            sandbox.boosted = False

    def _agent_argv(self) -> list[str]:
        if self.accelerator.name == "tcg":
            return [*AGENT_ARGV, "--patience", str(_TCG_AGENT_PATIENCE)]
        return list(AGENT_ARGV)

    async def _boot_new(self, sandbox: VmSandbox, timeout_s: float, incoming: Path | None
                        ) -> None:
        """A sandbox no session owns yet: if it does not start, nothing of it is left (its
        network and directories included), since nobody else will destroy it."""
        try:
            await self._boot(sandbox, timeout_s, incoming)
        except BaseException:
            await self.destroy(sandbox)
            raise

    async def _boot(self, sandbox: VmSandbox, timeout_s: float, incoming: Path | None) -> None:
        """Start QEMU for ``sandbox`` and wait for its agent's port (a new guest) or for the
        restored guest to run; on any failure no process of it is left running (its files
        stay: a failed resume keeps the hibernation file)."""
        started = time.monotonic()
        sandbox.stream_mark = None  # a new QEMU: its events count from 0
        sandbox.uid = self._uids.take()
        try:
            await in_thread_to_the_end(_prepare_host_side, sandbox, sandbox.uid)
            if sandbox.config.egress != "none" and sandbox.network is None:
                sandbox.network = await in_thread_to_the_end(
                    SessionNetwork.setup, sandbox.network_name, sandbox.egress,
                    sandbox.state_dir)
            wrap = jail_argv(self.image.files, sandbox.paths.runtime, sandbox.uid,
                             self.accelerator.name == "kvm", sandbox.cgroup.procs_files,
                             sandbox.network.path if sandbox.network is not None else None)
            net_files = {"hosts": hosts_file(sandbox.egress),
                         "resolv.conf": resolv_conf(sandbox.egress)}
            sandbox.guest = await start_guest(
                self.image, sandbox.config, sandbox.paths, self.accelerator, sandbox.env,
                timeout_s, incoming, wrap, net_files if incoming is None else None,
            )
            # What a later server needs to adopt it (adopt, adopt_checkpointed): a copy of a
            # snapshot or fork as much as a new guest (a copy had none, and a restart
            # failed it).
            await asyncio.to_thread((sandbox.state_dir / CONFIG_FILE).write_text,
                                    sandbox.config.to_json())
            if incoming is None:
                await sandbox.guest.agent_port_event(True, 0, timeout_s)
            else:
                await sandbox.guest.wait_running(timeout_s)
        except BaseException:
            await self.kill(sandbox)
            raise
        sandbox.timings["agent_ready" if incoming is None else "restore"] = (
            time.monotonic() - started
        )

    async def open_stream(self, sandbox: VmSandbox, read_limit: int) -> AgentStream:
        if sandbox.guest is None:
            raise DesktopFailed(f"{sandbox.label} is not running")
        # A host that reconnects at once could otherwise reach the agent before it has seen
        # the previous stream end, and its first bytes would land in that old connection.
        await self._agent_let_go(sandbox)
        sandbox.stream_mark = sandbox.guest.qmp.event_mark()
        try:
            # Not through a link QEMU's user put there (to a host socket of root's).
            with socket_address(sandbox.paths.agent) as address:
                return await asyncio.open_unix_connection(address, limit=read_limit)
        except OSError as error:
            raise DesktopFailed(f"cannot connect to the VM's agent port: {error!r}") from None

    async def close(self) -> None:
        self._image_hold.release()
        await asyncio.to_thread(self._host_watch.close)
        # The runtime directories' parent is this server's; a VM that runs on keeps it.
        with contextlib.suppress(OSError):
            runtime_root(self.state_dir).rmdir()

    async def kill(self, sandbox: VmSandbox) -> None:
        guest, sandbox.guest = sandbox.guest, None
        if guest is not None:
            await guest.stop()
        # A cgroup that would not go away may still hold QEMU's processes, running as the
        # VM's uid: that uid is not given back for another VM (SessionFailed skips it).
        await asyncio.to_thread(sandbox.cgroup.remove)
        if sandbox.uid is not None:
            self._uids.give_back(sandbox.uid)
            sandbox.uid = None

    async def destroy(self, sandbox: VmSandbox) -> None:
        """Everything of the VM goes, also when its QEMU would not (then SessionFailed,
        after the rest): its runtime directory is kept, so that the next server's removal
        of orphans finds the VM and tries again."""
        sandbox.ending = True
        try:
            await self.kill(sandbox)
        except SessionFailed as error:
            lingering: SessionFailed | None = error
        else:
            lingering = None
        network, sandbox.network = sandbox.network, None
        if network is None and sandbox.config.egress != "none":
            network = await asyncio.to_thread(SessionNetwork.find, sandbox.network_name,
                                              sandbox.state_dir)
        if network is not None:
            await asyncio.to_thread(network.teardown)
        await asyncio.to_thread(shutil.rmtree, sandbox.state_dir, True)
        if lingering is not None:
            raise lingering
        await asyncio.to_thread(remove_runtime, sandbox.paths.runtime)

    async def release(self, sandbox: VmSandbox) -> None:
        """A hibernated VM at server shutdown: its QEMU is gone already; keep its file
        and its network (the next server finds both)."""
        await self.kill(sandbox)
        if sandbox.network is not None:
            sandbox.network.forget()
        await asyncio.to_thread(remove_runtime, sandbox.paths.runtime)

    async def adopt(self, session_id: str) -> VmSandbox:
        """The VM a previous server started: QEMU runs on in its own process group when its
        server dies, and its agent waits for a new host on its port."""
        config = await asyncio.to_thread(_read_config, self.state_dir / "vm" / session_id)
        sandbox = VmSandbox(self.state_dir, self._max_execs, session_id, config)
        pid = await asyncio.to_thread(leftover_pid, sandbox.paths)
        if pid is None:
            raise SessionFailed("the VM's QEMU is gone (it ended with the previous server)")
        uid = (await asyncio.to_thread(sandbox.paths.runtime.stat)).st_uid
        try:
            qmp = await QmpClient.connect(sandbox.paths.qmp, self.handshake_timeout_s)
        except DesktopFailed as error:
            raise SessionFailed(f"cannot take over the VM: {error}") from None
        self._uids.claim(uid)
        sandbox.uid = uid
        sandbox.guest = VmGuest(pid, sandbox.paths, qmp)
        try:
            await self._find_network(sandbox)
            if await sandbox.guest.status() != "running":  # the previous server froze it
                await sandbox.guest.resume()
        except BaseException:
            # Not taken over: its QMP socket closed and its uid given back here (the
            # orphans' removal then stops its QEMU), not kept by a sandbox nobody holds.
            sandbox.guest = None
            await qmp.close()
            self._uids.give_back(uid)
            sandbox.uid = None
            raise
        return sandbox

    async def adopt_checkpointed(self, session_id: str) -> VmSandbox:
        directory = self.state_dir / "vm" / session_id
        config = await asyncio.to_thread(_read_config, directory)
        sandbox = VmSandbox(self.state_dir, self._max_execs, session_id, config)
        await _hibernation_file_kept(sandbox)
        await self._find_network(sandbox)
        return sandbox

    async def _find_network(self, sandbox: VmSandbox) -> None:
        """The network a previous server made for ``sandbox`` (egress all/allowlist)."""
        if sandbox.config.egress == "none":
            return
        sandbox.network = await asyncio.to_thread(SessionNetwork.find, sandbox.network_name,
                                                  sandbox.state_dir)
        if not sandbox.network.path.exists():
            raise SessionFailed("the VM's network namespace is gone")

    async def remove_orphans(self, keep: Collection[str]) -> list[str]:
        root = runtime_root(self.state_dir)
        ids: set[str] = set()
        for parent in (root, self.state_dir / "vm"):
            if parent.is_dir():
                ids.update(entry.name for entry in parent.iterdir() if entry.is_dir())
        removed = []
        for session_id in sorted(ids - set(keep)):
            try:
                sandbox = VmSandbox(self.state_dir, self._max_execs, session_id,
                                    VmConfig(egress="all"))  # so destroy looks for a network
            except InvalidRequest:
                continue  # not a session's directory
            try:
                await asyncio.to_thread(kill_leftover, sandbox.paths)
                await self.destroy(sandbox)
            except SessionFailed as error:
                # Not a reason to stop the server's start (it would stop every start: what
                # stays is found again each time); the next start tries it again.
                log.warning("orphaned VM of session %s not removed: %s", session_id,
                            error.message)
                continue
            removed.append(session_id)
        return removed

    # -- freeze and checkpoints ------------------------------------------------------------

    async def freeze(self, sandbox: VmSandbox) -> None:
        await self._running(sandbox).pause()

    async def thaw(self, sandbox: VmSandbox) -> None:
        await self._running(sandbox).resume()

    async def checkpoint(self, sandbox: VmSandbox) -> None:
        guest = self._running(sandbox)
        await self._agent_let_go(sandbox)
        with _save_files(sandbox, sandbox.state_dir):
            await asyncio.to_thread(sandbox.hibernation_file.unlink, True)
            # Before the save, which stops the guest: a full disk here leaves it running.
            await asyncio.to_thread((sandbox.state_dir / CONFIG_FILE).write_text,
                                    sandbox.config.to_json())
            size = await self._save(guest, sandbox.hibernation_file)
        if sandbox.ending:  # a delete came during the save, and was done before it
            raise _removed_meanwhile(sandbox)
        await self.kill(sandbox)
        sandbox.timings["hibernate"] = guest.timings["save"]
        sandbox.timings["hibernate_bytes"] = float(size)

    async def restore(self, sandbox: VmSandbox) -> None:
        await _hibernation_file_kept(sandbox)
        # Read back at its quota, a guest at cpus 0.1 took 17 s, and its agent 26 s more to
        # answer the host (of the handshake's 30 s): with less CPU the resume failed.
        sandbox.boosted = True
        await self._boot(sandbox, self.start_timeout(0), sandbox.hibernation_file)
        # The guest's whole memory (GiBs): freeing its blocks takes the kernel a while.
        await asyncio.to_thread(sandbox.hibernation_file.unlink, True)

    async def snapshot(self, sandbox: VmSandbox, directory: Path, packed: bool = True
                       ) -> SnapshotInfo:
        guest = self._running(sandbox)
        if sandbox.config.egress != "none":
            raise InvalidRequest(
                "snapshots and forks are available for sessions with network egress \"none\" "
                "only: a copy cannot take over the host-side network of this one")
        # As a restore: the save, and the guest's agent answering the host after it, under
        # the session's quota failed the snapshot at cpus 0.02 (no handshake in 30 s).
        # The session layer's started() ends it once the agent answers again.
        await asyncio.to_thread(sandbox.cgroup.set_cpus, None)
        sandbox.boosted = True
        await self._agent_let_go(sandbox)
        with _save_files(sandbox, directory):
            await asyncio.to_thread(directory.mkdir, 0o700)
            try:
                size = await self._save(guest, directory / HIBERNATION_FILE)
                await guest.resume()
                await asyncio.to_thread((directory / CONFIG_FILE).write_text,
                                        sandbox.config.to_json())
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, directory, True)
                raise
        return SnapshotInfo(guest.timings["save"], size, None)

    async def _save(self, guest: VmGuest, path: Path) -> int:
        """The guest's state into ``path``; if that fails, the guest runs on as before (a
        save stops it first) and the partial file is gone. SessionFailed if it does not
        run on: the session is lost then, whatever stopped the save; a guest that does run
        on fails no session (CheckpointUnavailable, InsufficientStorage, Timeout)."""
        try:
            return await guest.save(path, _SAVE_TIMEOUT_S)
        except BaseException as error:
            await asyncio.to_thread(path.unlink, True)
            try:
                await guest.resume()
            except (DesktopFailed, Timeout) as failed:
                if not isinstance(error, Exception):
                    raise error from None  # a cancel stays one
                why = error.message if isinstance(error, DeskboxError) else repr(error)
                raise SessionFailed(f"the VM was not saved ({why}), and did not run on after "
                                    f"it: {failed.message}") from None
            if isinstance(error, SessionFailed):  # QEMU refused the save; the guest runs on
                raise CheckpointUnavailable(f"the VM was not saved, and runs on: "
                                            f"{error.message}") from None
            raise

    async def _restore_copy(self, spec: SessionSpec, directory: Path, timeout_s: float
                            ) -> VmSandbox:
        state = directory / HIBERNATION_FILE
        if not await asyncio.to_thread(state.is_file):
            raise SessionFailed(f"the snapshot in {directory} holds no VM state (it was "
                                "taken by another engine)")
        saved = await asyncio.to_thread(_read_config, directory)
        # The copy's own CPU quota, from started() on (and in its vm.json, for its own
        # hibernations, snapshots and forks); its machine is the snapshot's (copies.py).
        config = copy_config(saved, spec.resources)
        sandbox = VmSandbox(self.state_dir, self._max_execs, spec.id, config)
        sandbox.boosted = not spec.background  # as a resume's (restore)
        await self._boot_new(sandbox, timeout_s, state)
        return sandbox

    async def _agent_let_go(self, sandbox: VmSandbox) -> None:
        """The caller closed its agent stream: wait until the guest's agent has closed its
        end too (it then waits for a new host), so a saved guest holds no half connection."""
        guest = self._running(sandbox)
        if sandbox.stream_mark is not None:  # None: no stream to this guest yet
            await guest.agent_port_event(False, sandbox.stream_mark, self.handshake_timeout_s)

    def _running(self, sandbox: VmSandbox) -> VmGuest:
        if sandbox.guest is None:
            raise SessionFailed(f"{sandbox.label} is not running")
        return sandbox.guest


def _read_config(directory: Path) -> VmConfig:
    try:
        return VmConfig.from_json((directory / CONFIG_FILE).read_text())
    except (OSError, ValueError, TypeError) as error:
        raise SessionFailed(f"the VM state in {directory} lacks a usable {CONFIG_FILE}: "
                            f"{error}") from None


@contextlib.contextmanager
def _save_files(sandbox: VmSandbox, where: Path) -> Iterator[None]:
    """The errors of a checkpoint's files (in ``where``) as the API tells them. Files that
    went with the VM: the session was deleted meanwhile (a delete does not wait for it), a
    conflict with that delete. A full disk or a quota: 507, and the VM runs on as it was."""
    try:
        yield
    except OSError as error:
        if sandbox.ending:
            raise _removed_meanwhile(sandbox) from None
        if error.errno in NO_ROOM:
            raise InsufficientStorage(f"no room on the server's disk for the VM's state "
                                      f"({where}): {error.strerror}") from None
        raise


def _removed_meanwhile(sandbox: VmSandbox) -> Conflict:
    return Conflict(f"{sandbox.label} was removed while it was saved (its session ended "
                    "meanwhile)")


async def _hibernation_file_kept(sandbox: VmSandbox) -> None:
    """SessionFailed unless the hibernated VM's memory file is still there to boot from."""
    if not await asyncio.to_thread(sandbox.hibernation_file.is_file):
        raise SessionFailed("the VM's hibernation file is gone")


def _prepare_host_side(sandbox: VmSandbox, uid: int) -> None:
    """The VM's directories (its runtime one owned by QEMU's user) and its cgroups."""
    sandbox.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    root = sandbox.paths.runtime.parent
    root.mkdir(mode=0o711, parents=True, exist_ok=True)  # QEMU's user passes through
    root.parent.chmod(0o711)
    sandbox.paths.runtime.mkdir(mode=0o700, exist_ok=True)
    mount_runtime(sandbox.paths.runtime)
    # A previous QEMU's files (before a hibernation) are its uid's, and this QEMU may run
    # as another (the uid went to another VM meanwhile): it could not open them (its
    # console's file among them), and the restore failed the session.
    empty(sandbox.paths.runtime)
    os.chown(sandbox.paths.runtime, uid, uid)
    # Boosted: no quota until VmEngine.started. config.cpu_quota stays the session's own:
    # what every later restore and copy (vm.json) is given.
    cpus = None if sandbox.boosted else sandbox.config.cpu_quota
    sandbox.cgroup.create(cpus, sandbox.config.cgroup_memory_bytes)
