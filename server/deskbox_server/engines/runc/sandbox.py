"""One session's sandbox: a runc container running Xvfb, openbox and Chromium.

Layout on the host, per session (``<state>/sessions/<id>``, mode 0700)::

    bundle/config.json      the OCI runtime config (oci.py); bundle/runc.log runc's messages
    /run/deskbox/<container id>/  a 256 KiB tmpfs, so the sandbox cannot fill the host's disk;
                            outside the state directory, because CRIU restores the bind
                            mount of x11/ from inside the sandbox's user namespace: only
                            root and the sandbox's gid can enter it (mode 0710)
      x11/                  bind-mounted at /tmp/.X11-unix inside: the X server's socket
      display/X<N>          our hard link of that socket (see displays.py), and ``number``
      display/agent         our hard link of the agent's socket x11/deskbox-agent
                            (agent_link.py)
      etc/                  with egress all/allowlist: the sandbox's hosts and resolv.conf
    /tmp/.X11-unix/X<N>     symlink to display/X<N>, so ``Desktop(":N")`` works on the host
    /tmp/.X<N>-lock         reserves N against X servers of the host
    with egress all/allowlist (engines/network.py):
    /run/netns/<container id>   the network namespace the sandbox joins, with its rules
    pasta.pid               the pasta process connecting it; bundle/hosts, resolv.conf (the
                            originals of etc/, which is made again from them)

``RuncSandbox.start`` returns once the sandbox's agent listens (its socket linked and
checked, agent_link.py; the init starts it once the X server accepts connections). The host
never connects to the X server: the agent tells when the window manager and the browser are
ready (RuncEngine). ``destroy`` leaves no container, process, cgroup, mount, network
namespace or file behind.

The server process should be a child subreaper (``processes.become_subreaper``):
runc exits after starting a sandbox, its init is reparented to us, and ``destroy`` reaps it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import resource
import shutil
import signal
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import Conflict, DesktopFailed, InvalidRequest, SessionFailed
from ...scratch import Scratch
from ..base import Sandbox, VolumeAttach
from ..desktop_commands import DEVTOOLS_PORT, DesktopSpec, session_env
from ..exit_note import exit_note
from ..fd_wait import readable
from ..network import (
    NETNS_DIR,
    Egress,
    SessionNetwork,
    hosts_file,
    namespaces,
    resolv_conf,
)
from . import freezer
from .criu_runs import CriuRuns
from .displays import (
    DisplayReservation,
    listener_pid,
    mount_tmpfs,
    namespace_pid,
    same_pid_namespace,
    unmount,
    wait_for_file,
)
from .id_overlap import checkpoint_root_gid
from .layout import (
    CPU_PERIOD_US,
    SANDBOX_USER_IDS,
    SOCKET_DIR,
    Limits,
    SandboxConfig,
    SandboxTemplate,
    set_cpu_quota,
    write_bundle,
    write_config,
)
from .runtime import Runc
from .seccomp import PODMAN_PROFILE
from .stream import AGENT_ARGV, ensure_agent_link
from .volume_mounts import VOLUMES_FILE, mount_volumes, remount_volumes, unmount_volumes

__all__ = [
    "RuncOptions",
    "RuncSandbox",
    "remove_orphans",
]

log = logging.getLogger("deskbox.runc")

_SESSION_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
LAUNCHER = "/usr/local/bin/deskbox-session"
_SHARED_DIR_OPTIONS = "size=256k,nr_inodes=64"
_ETC_FILES = ("hosts", "resolv.conf")
# In the session directory: the X server's display number inside, where not the host's.
_INNER_DISPLAY = "inner-display"
_HIDDEN_ENV = "DESKBOX_"  # the launcher's own variables: not for commands
# In the session directory: the X server's pid inside the sandbox, seen when it started.
_XSERVER_PID = "xserver-pid"
# The launcher gives the browser 3 s after SIGTERM and the rest 1 s (deskbox-session).
_GRACEFUL_STOP_S = 5.0
# How stale held() may be: it is asked before every action, and reads a cgroup file.
_HELD_CHECK_S = 1.0


@dataclass(frozen=True)
class RuncOptions:
    state_dir: Path
    rootfs: Path
    runc: Runc = field(default_factory=Runc)
    displays: tuple[int, int] = (200, 1000)  # [first, last) display numbers for sessions
    id_prefix: str = "deskbox-"
    seccomp_source: Path = PODMAN_PROFILE  # seccomp.py: the allowlist sandboxes start from
    # (first host id, count) of the sandboxes' user namespace; None: none (oci.py).
    user_ids: tuple[int, int] | None = SANDBOX_USER_IDS
    # Where each sandbox's small shared tmpfs is mounted (its own directory, by container id).
    shared_root: Path = Path("/run/deskbox")
    # runc execs (commands, file transfers) one session may run at once (exec_slots.py).
    max_execs: int = 8
    # Where checkpoint images that live for moments go when it has room (scratch.py); the
    # engine opens and closes it.
    scratch: Scratch | None = None


class RuncSandbox(Sandbox):
    """A started sandbox. Create with :meth:`start`; always end with :meth:`destroy`."""

    def __init__(self, options: RuncOptions, session_id: str) -> None:
        if not _SESSION_ID.match(session_id):
            raise InvalidRequest(f"session id {session_id!r} is not usable as a container id")
        self.options = options
        self.session_id = session_id
        self.container_id = options.id_prefix + session_id
        self.session_dir = options.state_dir.resolve() / "sessions" / session_id
        self.bundle = self.session_dir / "bundle"
        # A small tmpfs of the host's: the sandbox can write into x11/, and must not be able
        # to fill the host's disk through it. display/ shares its filesystem (hard links).
        self.shared_dir = options.shared_root / self.container_id
        self.socket_dir = self.shared_dir / "x11"
        self.display_dir = self.shared_dir / "display"
        self.display: DisplayReservation | None = None
        self.init_pid: int | None = None
        self._pidfd: int | None = None
        self.network: SessionNetwork | None = None  # egress all/allowlist (engines/network.py)
        self.timings: dict[str, float] = {}
        self._pending_cpus: float | None = None  # the quota to apply after start-up
        # Freezes of this server's own (a pause, a hold for copies, CRIU's dump): while
        # any is in effect, a frozen freezer is not someone else's doing (held()).
        self._own_freezes = 0
        self._held_checked: tuple[float, bool] = (float("-inf"), False)  # (when, frozen)
        self.criu_runs = CriuRuns()  # its checkpoints and restores in flight (criu.py)

    def _claim_session_dir(self) -> None:
        """Make the session directory; Conflict if another sandbox has it."""
        self.session_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self.session_dir.mkdir(mode=0o700)
        except FileExistsError:
            raise Conflict(f"a sandbox for session {self.session_id} exists already") from None

    @property
    def display_name(self) -> str:
        assert self.display is not None, "the sandbox has no display yet"
        return self.display.name

    # -- what the session layer knows of it (engines/base.py) ---------------------------

    @property
    def label(self) -> str:
        return f"the sandbox {self.container_id}"

    @property
    def running(self) -> bool:
        return self.init_pid is not None

    @property
    def agent_display(self) -> str:
        return f":{self.inner_display}"

    @property
    def vnc_socket_dir(self) -> str:
        return SOCKET_DIR  # where its X socket is, always writable inside

    @property
    def devtools_port(self) -> int:
        return DEVTOOLS_PORT

    @property
    def max_execs(self) -> int:
        return self.options.max_execs

    def exec_environment(self) -> tuple[dict[str, str], str]:
        """The environment of the sandbox's processes (from the config we wrote, which the
        sandbox cannot change, without the launcher's ``DESKBOX_*``), with ``DISPLAY``, and
        their working directory: commands run as they did through ``runc exec``."""
        process = json.loads((self.bundle / "config.json").read_text())["process"]
        env: dict[str, str] = {}
        for entry in process.get("env", []):
            key, _, value = str(entry).partition("=")
            if not key.startswith(_HIDDEN_ENV):
                env[key] = value
        env["DISPLAY"] = self.agent_display
        return env, str(process.get("cwd") or "/")

    # -- start ----------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        options: RuncOptions,
        session_id: str,
        spec: DesktopSpec | None = None,
        limits: Limits | None = None,
        browser: bool = True,
        timeout_s: float = 30.0,
        network: Egress | None = None,
        boost: bool = True,
        volumes: tuple[VolumeAttach, ...] = (),
    ) -> RuncSandbox:
        """``boost``: start at the host's full CPU, then apply ``limits.cpus``."""
        sandbox = cls(options, session_id)
        sandbox._claim_session_dir()
        try:
            sandbox._start(
                spec or DesktopSpec(), limits or Limits(), browser, timeout_s,
                network or Egress(), boost, volumes,
            )
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    @classmethod
    def adopt(cls, options: RuncOptions, session_id: str) -> RuncSandbox:
        """Take over a sandbox a previous server process started (it must still run)."""
        sandbox = cls(options, session_id)
        state = options.runc.state(sandbox.container_id)
        if state is None or state.status not in ("running", "paused"):
            raise SessionFailed(f"the sandbox {sandbox.container_id} is not running")
        if state.status == "paused":
            # Frozen by a pause the previous server did not finish (it was killed): its
            # session was never said to be paused, so it runs again (its agent would not
            # answer the server's connection, and the session failed for that).
            log.warning("session %s: thawing a sandbox frozen by a pause the previous "
                        "server did not finish", session_id)
            freezer.thaw(sandbox.container_id)
        display = DisplayReservation.find(sandbox.display_dir)
        if display is None or not display.private_socket.exists():
            raise SessionFailed(f"the sandbox {sandbox.container_id} has no published display")
        display.take_over()
        with contextlib.suppress(FileNotFoundError):
            display.host_link.unlink()
        display.host_link.symlink_to(display.private_socket)
        sandbox.display = display
        sandbox.init_pid = state.pid
        sandbox._pidfd = os.pidfd_open(state.pid)
        if (NETNS_DIR / sandbox.container_id).exists():
            sandbox.network = SessionNetwork.find(sandbox.container_id, sandbox.session_dir)
        return sandbox

    def _prepare_host_side(self, root_gid: int | None) -> None:
        """The shared tmpfs (entered by ``root_gid``, the host gid of the sandbox's root if
        it has a user namespace), the socket directory and a display number of the host."""
        root = self.options.shared_root
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        root.chmod(0o711)  # entered by the sandboxes' gid on the way to their own directory
        self.shared_dir.mkdir(mode=0o700)
        mount_tmpfs(self.shared_dir, f"{_SHARED_DIR_OPTIONS},mode=0700" if root_gid is None
                    else f"{_SHARED_DIR_OPTIONS},mode=0710,gid={root_gid}")
        self.socket_dir.mkdir()
        self.socket_dir.chmod(0o1777)  # what X servers expect of /tmp/.X11-unix
        self.display = DisplayReservation.allocate(
            self.display_dir, *self.options.displays
        )
        self._share_etc_files()  # a hibernated sandbox's, when its tmpfs is made again

    @property
    def inner_display(self) -> int:
        """The display number the X server uses inside the sandbox.

        The host's number (``display.number``) unless the sandbox was restored from another
        one's checkpoint (a fork): its X server kept the number it had there.
        """
        try:
            return int((self.session_dir / _INNER_DISPLAY).read_text())
        except FileNotFoundError:
            assert self.display is not None, "the sandbox has no display yet"
            return self.display.number

    @property
    def xserver_pid(self) -> int | None:
        """The X server's pid inside the sandbox (None if it was never recorded)."""
        try:
            return int((self.session_dir / _XSERVER_PID).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def record_xserver(self, host_pid: int) -> None:
        inner = namespace_pid(host_pid)
        if inner is not None:
            (self.session_dir / _XSERVER_PID).write_text(f"{inner}\n")

    def check_xserver_socket(self) -> None:
        """The published X socket must lead to the session's own X server: the process of
        its pid namespace with the X server's recorded pid. DesktopFailed otherwise (a
        process of the sandbox bound a socket of its own at the X server's path)."""
        assert self.display is not None and self.init_pid is not None
        try:
            pid = listener_pid(self.display.private_socket)
        except OSError as error:
            raise DesktopFailed(f"the sandbox's X socket does not answer: {error}") from None
        same_namespace = same_pid_namespace(pid, self.init_pid)
        expected = self.xserver_pid
        if not same_namespace or (expected is not None and namespace_pid(pid) != expected):
            raise DesktopFailed(
                "the sandbox's X socket does not lead to the session's X server (pid "
                f"{namespace_pid(pid)} in the sandbox, expected {expected})"
            )

    @classmethod
    def restore_copy(
        cls,
        options: RuncOptions,
        session_id: str,
        template: SandboxTemplate,
        restore: Callable[[RuncSandbox], object],
        limits: Limits | None = None,
        timeout_s: float = 30.0,
    ) -> RuncSandbox:
        """A new sandbox running a copy of another one's checkpointed processes.

        Its bundle is the dumped sandbox's config (``template``) with this sandbox's own
        socket directory, cgroup and ``limits``; ``restore`` runs CRIU on it
        (sandbox_snapshot.py). Returns once its X server answers; destroyed on failure.
        """
        sandbox = cls(options, session_id)
        sandbox._claim_session_dir()
        try:
            started = time.monotonic()
            sandbox._prepare_host_side(checkpoint_root_gid(options.user_ids, template.config))
            (sandbox.session_dir / _INNER_DISPLAY).write_text(f"{template.inner_display}\n")
            if template.xserver_pid is not None:
                (sandbox.session_dir / _XSERVER_PID).write_text(f"{template.xserver_pid}\n")
            write_config(
                sandbox.bundle,
                template.for_copy(sandbox.socket_dir, f"/{sandbox.container_id}",
                                  limits or Limits(), options.seccomp_source),
            )
            # It checks the X server's and the agent's listeners before anything runs.
            restore(sandbox)
            sandbox.timings["restore"] = time.monotonic() - started
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    @property
    def hibernate_archive(self) -> Path:
        """Where a hibernated sandbox's images are kept (zstd tar, mode 0600): in its session
        directory (mode 0700), so that destroying the session removes them."""
        return self.session_dir / "hibernate" / "images.tar.zst"

    def pin_inner_display(self) -> None:
        """Record the inner display number in the session directory, so that a server that
        restarts while the sandbox is checkpointed can restore it on any host number."""
        path = self.session_dir / _INNER_DISPLAY
        if not path.exists():
            path.write_text(f"{self.inner_display}\n")

    def release_host_side(self) -> None:
        """Give back the display number, the shared tmpfs and the volumes' mounts of a
        checkpointed sandbox (server shutdown); :meth:`adopt_checkpointed` makes them
        again."""
        unmount_volumes(self.shared_dir)
        if self.display is not None:
            self.display.release()
            self.display = None
        unmount(self.shared_dir)
        shutil.rmtree(self.shared_dir, ignore_errors=True)

    @classmethod
    def adopt_checkpointed(cls, options: RuncOptions, session_id: str) -> RuncSandbox:
        """Take over a hibernated sandbox a previous server left (checkpoint.py restores it).

        Its host side is made again where it is gone (the host rebooted meanwhile).
        """
        sandbox = cls(options, session_id)
        if not (sandbox.session_dir / _INNER_DISPLAY).is_file():
            raise SessionFailed(f"the sandbox {sandbox.container_id} was not checkpointed")
        state = options.runc.state(sandbox.container_id)
        if not sandbox.hibernate_archive.is_file():
            if state is not None and state.status != "stopped":
                raise SessionFailed(
                    f"the sandbox {sandbox.container_id} was resumed as the server stopped, "
                    "and its checkpoint is gone")
            raise SessionFailed(f"the sandbox {sandbox.container_id} has no checkpoint")
        if state is not None and state.status != "stopped":
            # A resume the previous server did not finish (it was killed): the session was
            # never said to run again, and its checkpoint is whole (removed only once the
            # restored copy runs), so the copy, sealed or not, is discarded.
            log.warning("session %s: discarding a restore the previous server did not "
                        "finish; it stays hibernated", session_id)
            sandbox.kill_processes()
        if state is not None:
            options.runc.delete(sandbox.container_id)
        for unfinished in sandbox.session_dir.glob("restore-*"):
            shutil.rmtree(unfinished, ignore_errors=True)  # criu.scratch_dirs' of that resume
        display = DisplayReservation.find(sandbox.display_dir)
        if display is None:
            sandbox.release_host_side()
            config = json.loads((sandbox.bundle / "config.json").read_text())
            gid = checkpoint_root_gid(options.user_ids, config)
            sandbox._prepare_host_side(gid)
            remount_volumes(sandbox.shared_dir, sandbox.session_dir,
                            (gid, gid) if gid is not None else (0, 0))
        else:
            display.take_over()
            sandbox.display = display
        return sandbox

    def _start_network(self, egress: Egress) -> tuple[Path | None, tuple[tuple[str, Path], ...]]:
        """The namespace to join and the files to show, for egress all/allowlist."""
        if egress.mode == "none":
            return None, ()
        started = time.monotonic()
        self.network = SessionNetwork.setup(self.container_id, egress, self.session_dir)
        self.timings["network"] = time.monotonic() - started
        self.bundle.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.bundle / "hosts").write_text(hosts_file(egress, SandboxConfig.hostname))
        (self.bundle / "resolv.conf").write_text(resolv_conf(egress))
        self._share_etc_files()
        etc = self.shared_dir / "etc"
        files = (("/etc/hosts", etc / "hosts"), ("/etc/resolv.conf", etc / "resolv.conf"))
        return self.network.path, files

    def _share_etc_files(self) -> None:
        """Copy the bundle's hosts and resolv.conf (egress all/allowlist) into the shared
        tmpfs, where the sandbox's own user can reach them (CRIU opens them from inside)."""
        if not (self.bundle / _ETC_FILES[0]).is_file():
            return
        etc = self.shared_dir / "etc"
        etc.mkdir(mode=0o755, exist_ok=True)
        for name in _ETC_FILES:
            shutil.copyfile(self.bundle / name, etc / name)
            (etc / name).chmod(0o644)

    def _start(
        self, spec: DesktopSpec, limits: Limits, browser: bool, timeout_s: float, egress: Egress,
        boost: bool, volumes: tuple[VolumeAttach, ...],
    ) -> None:
        started = time.monotonic()
        deadline = started + timeout_s
        ids = self.options.user_ids
        self._prepare_host_side(ids[0] if ids is not None else None)
        assert self.display is not None
        number = self.display.number
        netns, files = self._start_network(egress)
        env = session_env(spec, number, AGENT_ARGV, browser)
        # Start-up runs at the host's full CPU: under a 1-CPU quota Chromium alone takes
        # ~0.5 s longer to show its window. The session's own quota applies once it is ready.
        host_cpus = float(os.cpu_count() or 1) if boost else limits.cpus
        startup_limits = dataclasses.replace(limits, cpus=max(limits.cpus, host_cpus))
        # A user namespace only with a network namespace of its own: runc mounts a new
        # sysfs, which the kernel allows only to a holder of CAP_SYS_ADMIN in the user
        # namespace owning the network namespace, and the host-made one is the host's.
        user_ids = self.options.user_ids if netns is None else None
        root_ids = (user_ids[0], user_ids[0]) if user_ids is not None else (0, 0)
        binds = mount_volumes(self.shared_dir, self.session_dir, volumes, root_ids)
        config = SandboxConfig(
            rootfs=self.options.rootfs.resolve(), socket_dir=self.socket_dir, args=(LAUNCHER,),
            env=env, limits=startup_limits, cgroups_path=f"/{self.container_id}",
            nofile=min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
            network_namespace=netns, files=files, seccomp_source=self.options.seccomp_source,
            volumes=binds, user_ids=user_ids,
        )
        write_bundle(self.bundle, config)
        pid_file = self.bundle / "init.pid"
        self.options.runc.run_detached(self.container_id, self.bundle, pid_file)
        self.init_pid = int(pid_file.read_text())
        self._pidfd = os.pidfd_open(self.init_pid)
        self.timings["runc"] = time.monotonic() - started

        wait_for_file(
            self.socket_dir, f"X{number}", deadline - time.monotonic(), self.failure,
            wake_fds=(self._pidfd,),
        )
        self.display.publish(self.socket_dir / f"X{number}")
        self.timings["socket"] = time.monotonic() - started
        # The init starts the agent once the X server accepts connections.
        ensure_agent_link(self, max(0.1, deadline - time.monotonic()))
        self.timings["agent"] = time.monotonic() - started
        # Nothing but the launcher ran before the X server made its socket: its listener
        # is the X server, which every restore of this sandbox must lead to again.
        self._check_first_xserver()
        # The desktop's readiness (window manager, browser painted) is the agent's to tell
        # (RuncEngine); the session's own CPU quota applies after it.
        self._pending_cpus = limits.cpus if startup_limits.cpus != limits.cpus else None

    def apply_limits(self) -> None:
        """The session's own CPU quota, once its start-up (at the host's full CPU) is over."""
        cpus, self._pending_cpus = self._pending_cpus, None
        if cpus is not None:
            self.options.runc.set_cpus(self.container_id, cpus, CPU_PERIOD_US)
            set_cpu_quota(self.bundle, cpus)

    def _check_first_xserver(self) -> None:
        assert self.display is not None and self.init_pid is not None
        try:
            pid = listener_pid(self.display.private_socket)
        except OSError as error:
            raise DesktopFailed(f"the sandbox's X socket does not answer: {error}") from None
        if not same_pid_namespace(pid, self.init_pid):
            raise DesktopFailed("the X socket does not lead to the session's X server")
        self.record_xserver(pid)

    def adopt_init(self, pid: int) -> None:
        """The sandbox's init is now ``pid`` (restored from a checkpoint, checkpoint.py)."""
        self.init_pid = pid
        self._pidfd = os.pidfd_open(pid)

    def release_init(self) -> None:
        """The sandbox's processes ended (checkpointed): reap its init, forget it."""
        self._reap_init()
        self.init_pid = None

    # -- freezes --------------------------------------------------------------------------

    def freeze_own(self) -> None:
        """Freeze it (engine.freeze): ours, so held() does not take it for someone else's."""
        self._own_freezes += 1
        try:
            freezer.freeze(self.container_id)
        except BaseException:
            self._own_freezes -= 1
            raise

    def thaw_own(self) -> None:
        """Thaw it (engine.thaw), whoever froze it."""
        freezer.thaw(self.container_id)
        self._own_freezes = 0
        self._held_checked = (float("-inf"), False)

    @contextlib.contextmanager
    def frozen_for_a_while(self) -> Iterator[None]:
        """Around work that may freeze it and thaw it again (CRIU's dump and restore)."""
        self._own_freezes += 1
        try:
            yield
        finally:
            self._own_freezes = max(0, self._own_freezes - 1)
            self._held_checked = (float("-inf"), False)

    def held(self) -> str | None:
        """Frozen by someone else (``runc pause`` in Deskbox's runc root, a write to its
        freezer cgroup): calls are refused with the reason until it is thawed. Reads the
        freezer at most every ``_HELD_CHECK_S``."""
        if self._own_freezes:
            return None
        checked_at, frozen = self._held_checked
        now = time.monotonic()
        if now - checked_at >= _HELD_CHECK_S:
            frozen = self.running and freezer.frozen(self.container_id)
            self._held_checked = (now, frozen)
        if not frozen:
            return None
        return (f"{self.label} was frozen outside Deskbox (runc pause, or its freezer "
                "cgroup): resume it (runc resume), and the session goes on")

    # -- health ---------------------------------------------------------------------------

    def failure(self) -> str | None:
        """Why the sandbox is unusable (its init exited), or None while it runs. Cheap."""
        if self._pidfd is None:
            return "the sandbox is not running"
        if readable([self._pidfd]):
            why = exit_note(self.socket_dir)
            return f"the sandbox {self.container_id} exited" + (
                f" (its init: {why})" if why else "")
        return self.network.failure() if self.network is not None else None

    # -- destroy --------------------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL every process of the sandbox now, without talking to any of them, and
        the CRIU in flight on it first (criu_runs.py says why), and run no CRIU on it again.

        What destroy does first: its X server dies, so a host read blocked on it (a driver
        call to a stopped or grabbed X server) returns. Idempotent; never raises.
        """
        self.criu_runs.end()
        self.kill_processes()

    def kill_processes(self) -> None:
        """SIGKILL every process of the sandbox. Idempotent; never raises."""
        with contextlib.suppress(SessionFailed):  # a frozen sandbox could not die
            freezer.thaw(self.container_id)
        with contextlib.suppress(OSError, SessionFailed):  # runc not answering
            self.options.runc.kill(self.container_id)

    def destroy(self) -> None:
        """Kill every process of the sandbox and remove all it had on the host. Idempotent."""
        runc = self.options.runc
        errors: list[str] = []
        self.kill()
        try:
            runc.delete(self.container_id)
        except (SessionFailed, OSError) as error:
            errors.append(str(error))
        self._reap_init()
        try:
            unmount_volumes(self.shared_dir)
        except SessionFailed as error:
            errors.append(str(error))
        network = self.network or SessionNetwork.find(self.container_id, self.session_dir)
        try:
            network.teardown()
        except SessionFailed as error:
            errors.append(str(error))
        self.network = None
        if self.display is not None:
            self.display.release()
        unmount(self.shared_dir)
        with contextlib.suppress(FileNotFoundError):
            self.shared_dir.rmdir()
        if self.session_dir.exists():
            shutil.rmtree(self.session_dir, ignore_errors=True)
        if errors:
            raise SessionFailed("; ".join(errors))

    def stop(self) -> None:
        """Ask a sandbox with volumes to stop, before it is killed: SIGTERM to its init,
        which ends the browser and the rest in order (a few seconds at most), so that what
        the browser keeps in memory (it writes cookies every 30 s) reaches its profile
        volume. Nothing for a sandbox without volumes, whose files all go with it."""
        if not (self.session_dir / VOLUMES_FILE).is_file():
            return
        if self.init_pid is None or self._pidfd is None:
            return  # checkpointed: nothing runs
        with contextlib.suppress(SessionFailed):
            freezer.thaw(self.container_id)
        try:
            os.kill(self.init_pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        readable([self._pidfd], _GRACEFUL_STOP_S)

    def _reap_init(self) -> None:
        """The init may be our child (we are a subreaper, runc exited): collect it."""
        if self._pidfd is not None:
            readable([self._pidfd], 5.0)
            os.close(self._pidfd)
            self._pidfd = None
        if self.init_pid is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.init_pid, os.WNOHANG)


def remove_orphans(options: RuncOptions, keep: Collection[str] = ()) -> list[str]:
    """Destroy every sandbox of ``options`` whose session id is not in ``keep``.

    For a server that restarts: what the registry does not re-adopt is killed, and its
    directories, display symlink and lock file are removed. Returns the ids removed.
    """
    ids = {
        cid[len(options.id_prefix):] for cid in options.runc.list_ids()
        if cid.startswith(options.id_prefix)
    }
    sessions = options.state_dir.resolve() / "sessions"
    if sessions.is_dir():
        ids.update(entry.name for entry in sessions.iterdir() if entry.is_dir())
    ids.update(name[len(options.id_prefix):] for name in namespaces(options.id_prefix))
    if options.shared_root.is_dir():
        ids.update(entry.name[len(options.id_prefix):] for entry in options.shared_root.iterdir()
                   if entry.name.startswith(options.id_prefix))
    removed: list[str] = []
    for session_id in sorted(ids - set(keep)):
        if not _SESSION_ID.match(session_id):
            continue
        sandbox = RuncSandbox(options, session_id)
        sandbox.display = DisplayReservation.find(sandbox.display_dir)
        state = options.runc.state(sandbox.container_id)
        if state is not None and state.pid > 0:
            # So that destroy() reaps its init if it was reparented to us.
            with contextlib.suppress(ProcessLookupError):
                sandbox._pidfd = os.pidfd_open(state.pid)
                sandbox.init_pid = state.pid
        with contextlib.suppress(SessionFailed):
            sandbox.destroy()
        if sandbox.display is not None:
            sandbox.display.release(any_owner=True)
        removed.append(session_id)
    return removed
