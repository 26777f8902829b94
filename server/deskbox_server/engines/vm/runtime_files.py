"""The server's way into a VM's runtime directory, which QEMU's user owns (jail.py).

A QEMU that its guest subverted can put anything under any name there, while it runs or
before it exits: a symbolic link to a host file or socket, a FIFO that blocks its reader, a
file that never ends. The server runs as root and follows none of it. Its own files there
(QEMU's log and pid file) are made anew, never opened through a name QEMU could have
left; it reads only regular files, a bounded tail of them, without blocking; and it
connects to a socket only after taking the entry itself without following a link and
checking that it is a socket, then connects to that very inode through ``/proc/self/fd``
(as the docker engine reaches its agent: docker/agent_socket.py).

The directory is also a small tmpfs of the VM's own, so that what QEMU writes there (the
guest's console above all) cannot fill the host's /run.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from ...errors import SessionFailed
from ..runc.displays import mount_tmpfs, unmount

__all__ = [
    "RUNTIME_MB",
    "create_own",
    "empty",
    "mount_runtime",
    "remove_runtime",
    "socket_address",
]

# The runtime directory is a tmpfs of this size, the VM's own: the guest writes its serial
# console into it for as long as it likes (its root can, to /dev/ttyS0), and the host's
# /run is small and shared. The fw_cfg files (the session's environment: up to about a MiB
# with a long start URL) and QEMU's log take their share first.
RUNTIME_MB = 4
_RUNTIME_INODES = 64  # a dozen names: sockets, files, logs


def mount_runtime(directory: Path) -> None:
    """Make ``directory`` a tmpfs of :data:`RUNTIME_MB` unless it is one already (the
    same VM's before its hibernation); SessionFailed if it cannot be."""
    if os.path.ismount(directory):
        return
    try:
        mount_tmpfs(directory, f"size={RUNTIME_MB}m,nr_inodes={_RUNTIME_INODES},mode=0700")
    except OSError as error:
        raise SessionFailed(f"could not mount the VM's runtime directory: {error}") from None


def remove_runtime(directory: Path) -> None:
    """The runtime directory gone, its tmpfs first (nothing if it is gone already)."""
    unmount(directory)
    shutil.rmtree(directory, ignore_errors=True)


def create_own(path: Path, mode: int = 0o600) -> int:
    """A new, empty file at ``path`` for the server to write (its descriptor): whatever
    was at that name goes first, and the file is made by this call, not opened."""
    _remove(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    os.fchmod(fd, mode)  # whatever the server's umask
    return fd


def empty(directory: Path) -> None:
    """Remove everything in ``directory``, following no link."""
    for entry in os.scandir(directory):
        _remove(Path(entry.path))


def _remove(path: Path) -> None:
    try:
        path.unlink()  # a link itself, never what it points to
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        shutil.rmtree(path)  # follows no link inside either


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address of the unix socket at ``path`` itself, valid inside the block; OSError
    if nothing is there, or something other than a socket."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(errno.ENOTSOCK, f"{path.name} in the VM's runtime directory is "
                          "not a socket")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
