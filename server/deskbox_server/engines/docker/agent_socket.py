"""The host's way to a container's agent: its unix socket in the session's socket directory.

That directory is a host directory the container mounts at ``/tmp/.X11-unix``, writable by
every process of the sandbox, which may replace the socket by a symlink to any host path
or by a socket of its own. The host never connects by the path: it opens the directory it
made, takes the entry without following a link (``O_PATH | O_NOFOLLOW``), checks it is a
socket, and connects to that very inode through ``/proc/self/fd``. Whatever listens there
is a process of the sandbox, as hostile as any: the caller bounds every byte it reads
(agent/connection.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import time
from pathlib import Path

from ...errors import DesktopFailed

__all__ = ["agent_socket_ready", "connect_agent"]

_REFUSED_GRACE_S = 2.0
_REFUSED_RETRY_S = 0.02


def _open_entry(directory: Path, name: str) -> int | None:
    """An O_PATH descriptor of the socket ``name`` in ``directory``, or None if there is
    none yet (DesktopFailed if something else is there)."""
    try:
        dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    finally:
        os.close(dir_fd)
    if not stat.S_ISSOCK(os.fstat(fd).st_mode):
        os.close(fd)
        raise DesktopFailed(f"the sandbox put something other than a socket at {name}")
    return fd


def agent_socket_ready(directory: Path, name: str) -> bool:
    fd = _open_entry(directory, name)
    if fd is None:
        return False
    os.close(fd)
    return True


def _connected(directory: Path, name: str) -> socket.socket:
    # The agent binds its socket, then listens: a connect in between is refused. That gap
    # is short, so a refusal is retried for a while before it counts as no agent.
    refused_until = time.monotonic() + _REFUSED_GRACE_S
    while True:
        try:
            return _connect_once(directory, name)
        except ConnectionRefusedError as error:
            if time.monotonic() > refused_until:
                raise DesktopFailed(f"the sandbox's agent does not answer ({error})") from None
        time.sleep(_REFUSED_RETRY_S)


def _connect_once(directory: Path, name: str) -> socket.socket:
    fd = _open_entry(directory, name)
    if fd is None:
        raise DesktopFailed("the sandbox's agent is not listening")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(5.0)
        sock.connect(f"/proc/self/fd/{fd}")
        sock.setblocking(False)
    except ConnectionRefusedError:
        sock.close()
        raise
    except OSError as error:
        sock.close()
        raise DesktopFailed(f"the sandbox's agent does not answer ({error})") from None
    finally:
        os.close(fd)
    return sock


async def connect_agent(directory: Path, name: str, read_limit: int
                        ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = await asyncio.to_thread(_connected, directory, name)
    try:
        return await asyncio.open_unix_connection(sock=sock, limit=read_limit)
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
