"""A session's VNC server run and reached through the session's agent.

x11vnc runs inside the sandbox as a long-lived exec of the agent (``POST /v1/exec``,
PROTOCOL.md) whose stream the host keeps open: its stderr comes back on it (the last
lines say why it ended), and its status record says that it ended. It has the same flags
as ever (vnc_server.py ``x11vnc_argv``): no TCP port, only a unix socket with a fresh
name in the sandbox's socket directory, which only the agent is asked to connect to.

Every viewer connection is one agent channel to that socket (``POST /v1/channels/unix``),
bridged to a socket pair (agent_bridge.py) so the VNC proxy gets asyncio streams as
before. The host never touches the sandbox's files or namespaces for it. The connection
that found the server ready is kept for the first viewer (the hub connects right after a
start): x11vnc sets up its screen polling for a first client and tears it down when the
last one leaves, so a probe closed at once would cost the first frame about 200 ms.

Stopping it resets the exec's stream: the agent sends x11vnc SIGTERM, and SIGKILL only
``TERM_GRACE_S`` later (``stop_grace_s``), because x11vnc frees its SysV shared memory
segments only on a signal it handles. The same happens when the agent's connection ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from ..errors import Conflict, DeskboxError, SessionFailed, Timeout
from . import AgentClient, Channel, ExecStatus
from .bridge import Bridges
from .vnc_server import START_TIMEOUT_S, VncServer, x11vnc_argv

__all__ = ["SOCKET_DIR", "AgentVnc"]

log = logging.getLogger("deskbox.vnc")

SOCKET_DIR = "/tmp/.X11-unix"  # inside the sandbox: where its X socket is, always writable
TERM_GRACE_S = 2.0
# The agent's longest exec. A server that reaches it has failed(); the hub starts a new one
# for the next viewer.
LIFETIME_S = 24 * 3600.0
CONNECT_TIMEOUT_S = 7.0  # the agent's own connect timeout (5 s) and its answer
_OUTPUT_CAP = 64 * 1024  # per stream, dropped beyond by the agent; x11vnc -q says little
_LOG_LIMIT = 16 * 1024
_CLEANUP_TIMEOUT_S = 2.0
_SPARE_S = 5.0  # how long the connection made at start waits for the first viewer


class AgentVnc(VncServer):
    def __init__(self, agent: AgentClient, socket_path: str) -> None:
        self._agent = agent
        self.socket_path = socket_path
        self._log = bytearray()
        self._status: ExecStatus | None = None
        self._error: str | None = None
        self._stopped = False
        self._bridges = Bridges()
        self._task: asyncio.Task[None] | None = None
        self._spare: Channel | None = None  # the connection that found the server ready
        self._spare_at = 0.0

    @classmethod
    async def start(
        cls, agent: AgentClient, display: str, socket_dir: str = SOCKET_DIR,
        timeout_s: float = START_TIMEOUT_S,
    ) -> AgentVnc:
        """x11vnc on ``display`` in the sandbox, once it accepts connections.

        ``display`` and ``socket_dir`` are the sandbox's own (e.g. ``:0``).
        """
        server = cls(agent, f"{socket_dir}/vnc-{secrets.token_hex(6)}")
        argv = x11vnc_argv(display, server.socket_path)
        server._task = asyncio.create_task(server._run(argv), name="x11vnc")
        try:
            await server._wait_ready(timeout_s)
        except BaseException:
            await server.stop()
            raise
        return server

    async def _run(self, argv: list[str]) -> None:
        try:
            async for item in self._agent.exec(
                argv, timeout_s=LIFETIME_S, max_output=_OUTPUT_CAP, stop_grace_s=TERM_GRACE_S
            ):
                if isinstance(item, ExecStatus):
                    self._status = item
                else:
                    self._log += item.data
                    del self._log[:-_LOG_LIMIT]
        except DeskboxError as error:
            self._error = error.message

    async def _wait_ready(self, timeout_s: float) -> None:
        """Until a connection to the socket succeeds (it exists only after x11vnc's bind,
        and refuses until its listen); that connection is kept for the first viewer."""
        deadline = time.monotonic() + timeout_s
        pause = 0.01
        while True:
            failure = self.failure()
            if failure is not None:
                raise SessionFailed(f"the VNC server did not start: {failure}")
            try:
                channel = await self._agent.open_unix(
                    self.socket_path, timeout_s=max(0.1, deadline - time.monotonic()))
            except Timeout:
                raise Timeout(
                    f"the VNC server did not start in {timeout_s:g} s: the agent did not answer"
                ) from None
            except Conflict as error:  # connect_failed: not there yet
                if time.monotonic() + pause > deadline:
                    raise SessionFailed(
                        f"the VNC server did not accept connections in {timeout_s:g} s: "
                        f"{error.message}"
                    ) from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
                continue
            self._spare, self._spare_at = channel, time.monotonic()
            return

    def failure(self) -> str | None:
        if self._stopped:
            return "the VNC server was stopped"
        if self._agent.failed_reason is not None:
            return f"the session's agent failed: {self._agent.failed_reason}"
        if self._error is not None:
            return f"x11vnc through the agent: {self._error}"[:1000]
        if self._status is not None:
            status = self._status
            how = (f"signal {status.signal}" if status.signal is not None
                   else "its lifetime ran out" if status.timed_out else status.exit_code)
            said = self._log.decode(errors="replace").strip().splitlines()[-3:]
            return f"x11vnc exited ({how}): {' | '.join(said)}"[:1000]
        if self._task is not None and self._task.done():
            return "x11vnc's exec ended without a status"
        return None

    @property
    def viewers(self) -> int:
        return len(self._bridges)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        failure = self.failure()
        if failure is not None:
            raise SessionFailed(failure)
        channel, self._spare = self._spare, None
        if channel is not None and time.monotonic() - self._spare_at > _SPARE_S:
            channel.close()  # x11vnc may have given up on it
            channel = None
        if channel is None:
            try:
                channel = await self._agent.open_unix(
                    self.socket_path, timeout_s=CONNECT_TIMEOUT_S)
            except Conflict as error:
                raise SessionFailed(
                    f"the VNC server does not accept connections: {error.message}") from None
        sock = self._bridges.add(channel)
        try:
            return await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        except BaseException:
            sock.close()
            raise

    async def stop(self) -> None:
        """Reset x11vnc's exec (the agent stops it), end the viewers' channels and remove
        the socket; returns without waiting for x11vnc's grace to pass."""
        if self._stopped:
            return
        self._stopped = True
        if self._spare is not None:
            self._spare.close()
            self._spare = None
        try:
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            await self._bridges.close()
        finally:
            if self._agent.failed_reason is None:
                # x11vnc leaves its socket behind; a socket left in the sandbox is harmless
                # but would pile up with every restart.
                with contextlib.suppress(DeskboxError, TimeoutError):
                    async with asyncio.timeout(_CLEANUP_TIMEOUT_S):  # an agent that hangs
                        async for _ in self._agent.exec(
                            ["rm", "-f", "--", self.socket_path],
                            timeout_s=_CLEANUP_TIMEOUT_S, max_output=1024,
                        ):
                            pass
