"""A session's VNC server: x11vnc on the session's display, on a unix socket only.

x11vnc gets ``-rfbport 0 -rfbportv6 -1``: it opens no TCP port at all (without the
second, libvncserver still listens on ``[::]:5900``), and ``-unixsock`` puts its socket

- for a container session, in the sandbox's socket directory (``/tmp/.X11-unix`` inside,
  the session's ``shared/x11/`` on the host). As with the X socket (displays.py), the host
  takes a hard link of it into ``shared/display/`` the moment it appears, refuses anything
  that is not a socket, and checks after connecting that the peer is a process of the
  session's pid namespace. x11vnc runs inside the sandbox (``runc exec``), confined like
  every other process of the session;
- for a local session, in a private directory (mode 0700) of the host.

Connections to it are made only by the control plane's proxy (vnc/proxy.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import socket
import stat
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from ..errors import DesktopFailed, SessionFailed, Timeout
from .displays import peer_in_namespace, short_socket_path, wait_for_file
from .pipes import CappedBuffer, PipeReader, pipe
from .process_tree import Child
from .sandbox_exec import Launch, SandboxExec

__all__ = ["LocalVnc", "SandboxVnc", "VncServer", "x11vnc_argv"]

START_TIMEOUT_S = 15.0
_CONNECT_TIMEOUT_S = 5.0
# x11vnc frees its 42 SysV shared memory segments (≈ 7.5 MB at 1280x800) only when it exits
# on a signal it handles: SIGKILL leaks them (on the host, until shmmni's 4096 runs out and
# every x11vnc fails with "shmget(scanline) failed"). So SIGTERM first, SIGKILL after this.
_TERM_GRACE_S = 2.0
_LOG_LIMIT = 16 * 1024


def x11vnc_argv(display: str, socket_path: str) -> list[str]:
    """x11vnc serving ``display`` on the unix socket ``socket_path`` and nothing else."""
    return [
        "x11vnc", "-display", display,
        "-unixsock", socket_path, "-rfbport", "0", "-rfbportv6", "-1", "-noipv6",
        "-shared", "-forever", "-nopw",  # many viewers; the proxy does authentication
        "-nolookup", "-nocmds", "-noremote", "-nossl", "-q",
        "-noxrecord",  # XRECORD's polling is not needed with XDAMAGE on Xvfb
        "-nonap",  # no longer naps between screen polls when the screen is idle
        # x11vnc creates its selection window (and starts XFIXES) only ~8-45 s after the
        # first viewer came, "to get past a display manager": until then a viewer's paste
        # cannot own CLIPBOARD/PRIMARY and the selections are not polled. No DM here.
        "-env", "X11VNC_AVOID_WINDOWS=never",
    ]


class VncServer(ABC):
    """One running VNC server; connect as often as needed, then ``stop`` it."""

    @abstractmethod
    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new RFB connection to the server (before its ProtocolVersion)."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the server is gone, or None while it runs."""

    @abstractmethod
    async def stop(self) -> None:
        """End the server and remove its socket; idempotent."""


async def _open(path: Path, check: Callable[[socket.socket], bool] | None = None) -> tuple[
    asyncio.StreamReader, asyncio.StreamWriter
]:
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    try:
        with short_socket_path(path) as address:
            return await _connect_loop(loop, address, deadline, check)
    except FileNotFoundError:
        raise SessionFailed(f"the VNC server's socket directory {path.parent} is gone") from None


async def _connect_loop(
    loop: asyncio.AbstractEventLoop, address: str, deadline: float,
    check: Callable[[socket.socket], bool] | None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, address)
        except (ConnectionRefusedError, FileNotFoundError) as error:
            sock.close()
            # The socket file appears at bind(); listen() follows a moment later.
            if time.monotonic() > deadline:
                raise SessionFailed(
                    f"the VNC server does not accept connections: {error}"
                ) from None
            await asyncio.sleep(0.01)
            continue
        except BaseException:
            sock.close()
            raise
        if check is not None and not check(sock):
            sock.close()
            raise DesktopFailed("the VNC socket does not lead to the session's VNC server")
        return await asyncio.open_unix_connection(sock=sock, limit=1 << 20)


def _take_link(sandbox_socket: Path, private_socket: Path) -> None:
    """Our own hard link of the sandbox's socket; anything but a socket is refused."""
    private_socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # linkat without AT_SYMLINK_FOLLOW: a symlink is linked as itself, and refused below.
    os.link(sandbox_socket, private_socket, follow_symlinks=False)
    if not stat.S_ISSOCK(os.lstat(private_socket).st_mode):
        private_socket.unlink()
        raise DesktopFailed("the sandbox's VNC socket is not a socket")


class SandboxVnc(VncServer):
    def __init__(
        self, launch: Launch, log: CappedBuffer, drain: asyncio.Task[None],
        sandbox_socket: Path, private_socket: Path, init_pid: int,
    ) -> None:
        self._launch = launch
        self._log = log
        self._drain = drain
        self._sandbox_socket = sandbox_socket
        self.private_socket = private_socket
        self._init_pid = init_pid
        self._stopped = False
        # Awaiting the exit is what records it (returncode), for failure().
        self._exited = asyncio.create_task(launch.wait())

    @classmethod
    async def start(
        cls, runner: SandboxExec, socket_dir: Path, private_dir: Path
    ) -> SandboxVnc:
        """x11vnc in the sandbox; ``socket_dir`` is the host's view of its /tmp/.X11-unix."""
        name = f"vnc-{secrets.token_hex(6)}"
        sandbox_socket = socket_dir / name
        private_socket = private_dir / name
        err_read, err_write = pipe()
        reader = PipeReader(err_read)
        try:
            launch = await runner.launch(
                x11vnc_argv(runner.display, f"/tmp/.X11-unix/{name}"), stderr=err_write
            )
        except BaseException:
            reader.close()
            raise
        finally:
            os.close(err_write)
        log = CappedBuffer(_LOG_LIMIT)
        drain = asyncio.create_task(log.drain(reader))
        drain.add_done_callback(lambda _: reader.close())
        server = cls(launch, log, drain, sandbox_socket, private_socket, runner.init_pid)
        try:
            await asyncio.to_thread(
                wait_for_file, socket_dir, name, START_TIMEOUT_S, server.failure
            )
            await asyncio.to_thread(_take_link, sandbox_socket, private_socket)
        except BaseException:
            await server.stop()
            raise
        return server

    def failure(self) -> str | None:
        if self._stopped:
            return "the VNC server was stopped"
        return _exit_failure(self._launch.returncode, self._log.value())

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure = self.failure()
        if failure is not None:
            raise SessionFailed(failure)
        return await _open(
            self.private_socket, lambda sock: peer_in_namespace(sock, self._init_pid)
        )

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            leader = self._launch.leader()
            if leader is not None and self._launch.returncode is None:
                with contextlib.suppress(OSError):
                    # Still runc's child (not reaped), and checked to be the sandbox's.
                    if os.readlink(f"/proc/{leader}/ns/pid") == self._launch.pidns:
                        os.kill(leader, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._exited), _TERM_GRACE_S)
            await self._launch.kill()
            await self._exited
        finally:
            self._launch.cleanup()
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            for path in (self.private_socket, self._sandbox_socket):
                with contextlib.suppress(OSError):
                    path.unlink()


class LocalVnc(VncServer):
    """x11vnc as a host process (the unisolated local backend)."""

    def __init__(self, child: Child, log: CappedBuffer, drain: asyncio.Task[None],
                 directory: Path) -> None:
        self._child = child
        self._log = log
        self._drain = drain
        self._directory = directory
        self.socket_path = directory / "vnc"
        self._stopped = False
        self._exited = asyncio.create_task(child.wait())

    @classmethod
    async def start(cls, display: str) -> LocalVnc:
        directory = Path(tempfile.mkdtemp(prefix="deskbox-vnc-"))  # mode 0700
        err_read, err_write = pipe()
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        reader = PipeReader(err_read)
        try:
            child = Child(x11vnc_argv(display, str(directory / "vnc")),
                          {0: null, 1: null, 2: err_write})
        except BaseException:
            reader.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        finally:
            os.close(err_write)
            os.close(null)
        log = CappedBuffer(_LOG_LIMIT)
        drain = asyncio.create_task(log.drain(reader))
        drain.add_done_callback(lambda _: reader.close())
        server = cls(child, log, drain, directory)
        try:
            await asyncio.to_thread(
                wait_for_file, directory, "vnc", START_TIMEOUT_S, server.failure
            )
        except BaseException:
            await server.stop()
            raise
        return server

    def failure(self) -> str | None:
        if self._stopped:
            return "the VNC server was stopped"
        return _exit_failure(self._child.returncode, self._log.value())

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure = self.failure()
        if failure is not None:
            raise SessionFailed(failure)
        return await _open(self.socket_path)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._child.pid, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._exited), _TERM_GRACE_S)
            if self._child.returncode is None:
                self._child.kill()
                try:
                    await asyncio.wait_for(asyncio.shield(self._exited), 5.0)
                except TimeoutError:
                    raise Timeout("x11vnc did not exit") from None
        finally:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain
            shutil.rmtree(self._directory, ignore_errors=True)


def _exit_failure(returncode: int | None, log: bytes) -> str | None:
    """Why x11vnc is gone (its exit code and last log lines), or None while it runs."""
    if returncode is None:
        return None
    said = log.decode(errors="replace").strip().splitlines()[-3:]
    return f"x11vnc exited ({returncode}): {' | '.join(said)}"[:1000]
