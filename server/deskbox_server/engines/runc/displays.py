"""Making a sandbox's X server reachable from the host as an ordinary display ``:N``.

X clients (python-xlib, mss/xcb) only look for ``/tmp/.X11-unix/X<N>``, so the host keeps,
per session:

- a reservation of ``N``: the lock file ``/tmp/.X<N>-lock`` that X servers use themselves,
  holding our pid, so no host X server takes the same number (xcb tries the abstract
  socket ``@/tmp/.X11-unix/X<N>`` of the host's network namespace first);
- a hard link of the sandbox's socket in a directory the sandbox cannot see
  (``<session>/display/X<N>``). The socket directory is writable by the sandbox, which
  could swap its socket for a symlink to another session's or the host's; the link is
  taken once, right after the X server made its socket, and stays ours;
- the symlink ``/tmp/.X11-unix/X<N>`` to that hard link.

After connecting, :func:`peer_in_namespace` checks that the other end of the socket is a
process of the session's pid namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...errors import Capacity, DesktopFailed, Timeout
from ..fd_wait import readable

__all__ = [
    "HOST_SOCKET_DIR",
    "DisplayReservation",
    "link_socket",
    "listener_pid",
    "mount_tmpfs",
    "namespace_pid",
    "peer_in_namespace",
    "peer_pid",
    "same_pid_namespace",
    "short_socket_path",
    "unmount",
    "wait_for_file",
]

HOST_SOCKET_DIR = Path("/tmp/.X11-unix")


class DisplayReservation:
    """Display number ``N`` held for one session, and its host-side socket path."""

    def __init__(self, number: int, private_dir: Path) -> None:
        self.number = number
        self.private_dir = private_dir
        self.name = f":{number}"
        self.lock_path = Path(f"/tmp/.X{number}-lock")
        self.host_link = HOST_SOCKET_DIR / f"X{number}"
        self.private_socket = private_dir / f"X{number}"

    @classmethod
    def allocate(cls, private_dir: Path, first: int, last: int) -> DisplayReservation:
        """Reserve the lowest free number in [first, last) the way X servers do."""
        _ensure_host_socket_dir()
        content = f"{os.getpid():>10}\n".encode()
        for number in range(first, last):
            if (HOST_SOCKET_DIR / f"X{number}").exists() or os.path.lexists(
                HOST_SOCKET_DIR / f"X{number}"
            ):
                continue
            try:
                fd = os.open(f"/tmp/.X{number}-lock", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
            except FileExistsError:
                continue
            with os.fdopen(fd, "wb") as lock:
                lock.write(content)
            private_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (private_dir / "number").write_text(f"{number}\n")
            return cls(number, private_dir)
        raise Capacity(f"no free X display number in {first}..{last - 1}")

    @classmethod
    def find(cls, private_dir: Path) -> DisplayReservation | None:
        """The reservation recorded in ``private_dir`` by :meth:`allocate`, if any."""
        try:
            number = (private_dir / "number").read_text().strip()
        except FileNotFoundError:
            return None
        return cls(int(number), private_dir) if number.isdigit() else None

    def take_over(self) -> None:
        """Write our pid into the lock (a restarted server adopting a running session).
        DesktopFailed if another X server claimed the number while no server held it (its
        lock named a dead process, which X servers take for stale)."""
        self._refuse_if_foreign()
        self.lock_path.write_bytes(f"{os.getpid():>10}\n".encode())

    def publish(self, sandbox_socket: Path) -> None:
        """Link the sandbox's socket privately, then point ``/tmp/.X11-unix/X<N>`` at it;
        never over another X server's socket."""
        self._refuse_if_foreign()
        self.private_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        link_socket(sandbox_socket, self.private_socket, "X socket")
        _ensure_host_socket_dir()
        with contextlib.suppress(FileNotFoundError):
            self.host_link.unlink()
        self.host_link.symlink_to(self.private_socket)

    def _foreign(self) -> bool:
        """Whether a process other than this server, alive, holds the number: its lock
        names it, or the host's socket path is not our link."""
        with contextlib.suppress(OSError):
            if os.readlink(self.host_link) != str(self.private_socket):
                return True
        if os.path.exists(self.host_link) and not os.path.islink(self.host_link):
            return True
        return _held_by_another(self.lock_path)

    def _refuse_if_foreign(self) -> None:
        if self._foreign():
            raise DesktopFailed(f"display {self.name} was taken by another X server of the "
                                "host while no server held it")

    def release(self, any_owner: bool = False) -> None:
        """Remove the symlink (only if it is ours), the private link and the lock file.

        The lock goes only if it holds our pid, unless ``any_owner`` (an orphan's cleanup).
        """
        with contextlib.suppress(OSError):
            if os.readlink(self.host_link) == str(self.private_socket):
                self.host_link.unlink()
        with contextlib.suppress(FileNotFoundError):
            self.private_socket.unlink()
        with contextlib.suppress(OSError):
            owner = self.lock_path.read_bytes().strip()
            if owner == str(os.getpid()).encode() or (
                    any_owner and not _held_by_another(self.lock_path)):
                self.lock_path.unlink()


def _held_by_another(lock_path: Path) -> bool:
    """Whether the X lock names a live process other than this one (X servers write their
    pid there; a dead one's lock is stale, theirs and ours alike)."""
    try:
        owner = lock_path.read_bytes().strip()
    except OSError:
        return False
    if not owner.isdigit() or int(owner) in (0, os.getpid()):
        return False
    return os.path.exists(f"/proc/{int(owner)}")


def link_socket(sandbox_socket: Path, private_link: Path, what: str) -> None:
    """Hard-link the sandbox's socket at ``private_link`` (replacing it): the link keeps
    leading to that socket whatever a sandbox process does to its path afterwards.
    DesktopFailed if it is not a socket (a symlink, a file)."""
    with contextlib.suppress(FileNotFoundError):
        private_link.unlink()
    # linkat without AT_SYMLINK_FOLLOW: a symlink is linked as itself, and refused below.
    os.link(sandbox_socket, private_link, follow_symlinks=False)
    mode = os.lstat(private_link).st_mode
    if not stat.S_ISSOCK(mode):
        private_link.unlink()
        raise DesktopFailed(f"the sandbox's {what} is not a socket")


def _ensure_host_socket_dir() -> None:
    try:
        HOST_SOCKET_DIR.mkdir(mode=0o1777)
    except FileExistsError:
        return
    HOST_SOCKET_DIR.chmod(0o1777)  # mkdir's mode is cut by the umask


def peer_pid(sock: socket.socket) -> int:
    """The host pid of the process at the other end of the unix socket ``sock``."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid: int = struct.unpack("3i", creds)[0]
    return pid


def same_pid_namespace(pid: int, init_pid: int) -> bool:
    """Whether host process ``pid`` lives in ``init_pid``'s pid namespace."""
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino == os.stat(
            f"/proc/{init_pid}/ns/pid"
        ).st_ino
    except FileNotFoundError:
        return False


def peer_in_namespace(sock: socket.socket, init_pid: int) -> bool:
    """Whether the process at the other end of ``sock`` lives in ``init_pid``'s pid namespace."""
    return same_pid_namespace(peer_pid(sock), init_pid)


def namespace_pid(host_pid: int) -> int | None:
    """The pid of host process ``host_pid`` in its own (innermost) pid namespace."""
    try:
        status = Path(f"/proc/{host_pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return None


def listener_pid(socket_path: Path) -> int:
    """The host pid of the process that listens on the unix socket ``socket_path``.

    Only connects: the kernel gives the listener's credentials at once, even while the
    listener is stopped, and no byte is exchanged.
    """
    with short_socket_path(socket_path) as address, socket.socket(
        socket.AF_UNIX, socket.SOCK_STREAM
    ) as sock:
        sock.settimeout(2.0)
        sock.connect(address)
        return peer_pid(sock)


@contextlib.contextmanager
def short_socket_path(path: Path) -> Iterator[str]:
    """An address for the unix socket ``path`` that fits: a socket's address is at most 107
    bytes, and a deep state dir makes longer paths. The directory, opened, gives a short
    one, ``/proc/self/fd/<fd>/<name>``, valid inside the block. FileNotFoundError if the
    directory is gone."""
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


# -- the session's small host tmpfs ------------------------------------------------------

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_UMOUNT_NOFOLLOW = 8


def mount_tmpfs(target: Path, options: str) -> None:
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _libc.mount(b"deskbox", os.fsencode(target), b"tmpfs", flags, options.encode()) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount tmpfs on {target}: {os.strerror(error)}")


def unmount(target: Path) -> None:
    """Detach whatever is mounted on ``target``; nothing if nothing is."""
    while _libc.umount2(os.fsencode(target), _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
        pass  # mounted more than once: take them all off


# -- waiting for a file without polling --------------------------------------------------

_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80
_IN_CLOEXEC = os.O_CLOEXEC
_IN_NONBLOCK = os.O_NONBLOCK
_libc = ctypes.CDLL(None, use_errno=True)


def wait_for_file(
    directory: Path, name: str, timeout_s: float, alive: Callable[[], str | None],
    wake_fds: tuple[int, ...] = (),
) -> None:
    """Return once ``directory/name`` exists (a dangling symlink too); told by inotify, not
    by polling.

    ``alive`` returns why waiting is pointless (the sandbox died) or None; it is checked
    whenever one of ``wake_fds`` (e.g. a pidfd) becomes readable, and every 100 ms.
    """
    fd = _libc.inotify_init1(_IN_CLOEXEC | _IN_NONBLOCK)
    if fd < 0:
        # A session may have used up the host root's inotify instances (they are counted
        # per user, and charged to the host's root even from a user namespace): poll.
        _poll_for_file(directory / name, timeout_s, alive)
        return
    try:
        if _libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) < 0:
            _poll_for_file(directory / name, timeout_s, alive)  # watches used up, likewise
            return
        deadline = time.monotonic() + timeout_s
        while not os.path.lexists(directory / name):  # a symlink counts: the caller refuses it
            failure = alive()
            if failure is not None:
                raise DesktopFailed(failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"timed out after {timeout_s:.1f} s waiting for {directory / name}")
            if fd in readable([fd, *wake_fds], min(remaining, 0.1)):
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 65536)  # drain; the loop re-checks the path itself
    finally:
        os.close(fd)


def _poll_for_file(path: Path, timeout_s: float, alive: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.lexists(path):
        failure = alive()
        if failure is not None:
            raise DesktopFailed(failure)
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout_s:.1f} s waiting for {path}")
        time.sleep(0.005)
