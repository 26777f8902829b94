"""The host's one stream to a runc sandbox's agent (``deskbox-agent``, desktop_image/agent/).

The sandbox's init starts the agent once its X server is ready (``DESKBOX_AGENT``, the
command line below) and starts it again when it exits. The agent listens on a unix socket
in the sandbox's socket directory, ``/tmp/.X11-unix/deskbox-agent`` inside, which is
``x11/deskbox-agent`` of the session's shared tmpfs on the host.

That directory is writable by every process of the sandbox, so the host treats the agent's
socket like the X socket (displays.py): it takes a hard link of it in ``display/agent``,
which no sandbox process can reach, and checks that the process listening on it is one of
the sandbox's pid namespace; the host only ever connects through that link. After a
restore the link is taken while every task is still stopped (checkpoint.restore), so a
process waiting to swap the path gets no chance. Whatever listens there is still a
process of the sandbox, hostile like all of them: the client bounds every byte
(agent/connection.py) and a misbehaving agent fails only its own session.

CRIU cannot dump a unix connection whose peer is outside the sandbox: the backend closes
the host's connection before every checkpoint and connects a new one after every restore
(sessions/desktop.py). The agent exiting (killed from inside, out of memory) ends the
host's connection, and the session fails with that reason: the agent is part of the
desktop like its X server, and the host does not quietly reconnect to whatever listens at
the path next.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Protocol

from ...errors import DesktopFailed, Timeout
from .displays import (
    link_socket,
    listener_pid,
    namespace_pid,
    same_pid_namespace,
    short_socket_path,
    wait_for_file,
)

__all__ = [
    "AGENT_ARGV",
    "AGENT_SOCKET",
    "AGENT_START_TIMEOUT_S",
    "agent_link",
    "check_agent_listener",
    "ensure_agent_link",
    "link_agent",
    "open_agent_stream",
]

AGENT_SOCKET = "deskbox-agent"  # in the socket directory, /tmp/.X11-unix inside
AGENT_ARGV = ("/usr/local/bin/deskbox-agent", "--listen", f"unix:/tmp/.X11-unix/{AGENT_SOCKET}")
AGENT_START_TIMEOUT_S = 15.0
_LINK = "agent"  # our hard link, in the session's display/ directory
_RETRY_S = 0.005


class AgentHome(Protocol):
    """What the link needs of a sandbox (RuncSandbox has it; named here, so that this
    module does not import the sandbox that imports it)."""

    @property
    def display_dir(self) -> Path: ...
    @property
    def socket_dir(self) -> Path: ...
    @property
    def init_pid(self) -> int | None: ...
    def failure(self) -> str | None: ...


def agent_link(sandbox: AgentHome) -> Path:
    return sandbox.display_dir / _LINK


def check_agent_listener(sandbox: AgentHome) -> None:
    """Our link must lead to a listener of the sandbox's pid namespace. OSError while
    nothing listens (yet); DesktopFailed if a process of another namespace does."""
    assert sandbox.init_pid is not None, "the sandbox is not running"
    pid = listener_pid(agent_link(sandbox))
    if not same_pid_namespace(pid, sandbox.init_pid):
        raise DesktopFailed(
            f"the sandbox's agent socket leads to a process outside it (host pid {pid}, "
            f"{namespace_pid(pid)} in its namespace)"
        )


def link_agent(sandbox: AgentHome) -> bool:
    """Link the agent's socket if the sandbox has one now, and check its listener (which
    may be stopped: the kernel answers a connect for it). False, and no link, if it has
    none (the agent was being restarted when the sandbox was checkpointed)."""
    link = agent_link(sandbox)
    try:
        link_socket(sandbox.socket_dir / AGENT_SOCKET, link, "agent socket")
    except FileNotFoundError:
        link.unlink(missing_ok=True)
        return False
    try:
        check_agent_listener(sandbox)
    except OSError as error:
        raise DesktopFailed(f"the sandbox's agent socket does not answer: {error}") from None
    return True


def ensure_agent_link(sandbox: AgentHome, timeout_s: float = AGENT_START_TIMEOUT_S) -> None:
    """Make our link lead to the agent's listener: the one linked before if it still
    listens, else the socket at the path now, waited for (the agent starts after the X
    server). DesktopFailed or Timeout if there is none in time."""
    deadline = time.monotonic() + timeout_s
    if agent_link(sandbox).exists():
        with contextlib.suppress(OSError):
            check_agent_listener(sandbox)
            return
    wait_for_file(sandbox.socket_dir, AGENT_SOCKET, timeout_s, sandbox.failure)
    while True:
        try:
            link_socket(sandbox.socket_dir / AGENT_SOCKET, agent_link(sandbox), "agent socket")
            check_agent_listener(sandbox)  # bound, but perhaps not listening yet
            return
        except OSError as error:
            failure = sandbox.failure()
            if failure is not None:
                raise DesktopFailed(f"the agent did not start: {failure}") from None
            if time.monotonic() > deadline:
                raise Timeout(f"the sandbox's agent did not listen: {error}") from None
            time.sleep(_RETRY_S)


async def open_agent_stream(
    sandbox: AgentHome, read_limit: int, timeout_s: float = AGENT_START_TIMEOUT_S,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection to the sandbox's agent, through our link (the handshake is the
    caller's: sessions/desktop.py)."""
    await asyncio.to_thread(ensure_agent_link, sandbox, timeout_s)
    with short_socket_path(agent_link(sandbox)) as address:
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.open_unix_connection(address, limit=read_limit)
        except (OSError, TimeoutError) as error:
            raise DesktopFailed(f"cannot connect to the sandbox's agent: {error!r}") from None
