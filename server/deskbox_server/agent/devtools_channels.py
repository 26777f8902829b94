"""A session browser's DevTools, reached through the session's agent instead of ``setns``.

Each connection is one agent channel to ``127.0.0.1:DEVTOOLS_PORT`` inside the sandbox
(``POST /v1/channels/tcp/<port>``, PROTOCOL.md), bridged to a socket (agent_bridge.py),
so it is a :class:`~.devtools.DevtoolsSocket` like the ones ``connect_tcp`` makes:
``get_json``, ``browser_path`` and ``open_websocket`` (devtools.py), and above them the
CDP relay's bounds (api/cdp_relay.py, api/abort.py), work on it unchanged.
"""

from __future__ import annotations

from ..errors import BrowserUnavailable, Conflict, Timeout
from . import AgentClient
from .bridge import Bridges
from .devtools import CONNECT_TIMEOUT_S, DevtoolsSocket

__all__ = ["AgentDevtools"]

# The agent gives a connect CONNECT_TIMEOUT_S and then answers 502: wait a little longer
# for that answer than the agent waits for the browser.
_ANSWER_GRACE_S = 2.0


class AgentDevtools:
    """Opens DevTools connections of one session; ``open`` is a ``devtools.Opener``."""

    def __init__(
        self, agent: AgentClient, port: int,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.agent = agent  # after a restore the session has a new one: make a new opener
        self._port = port
        self._timeout_s = connect_timeout_s + _ANSWER_GRACE_S
        self._bridges = Bridges()

    @property
    def open_connections(self) -> int:
        return len(self._bridges)

    async def open(self) -> DevtoolsSocket:
        """A new connection to the browser's DevTools server.

        BrowserUnavailable while the browser does not accept connections, Timeout when
        the agent does not answer in time, AgentFailed (a SessionFailed) when the agent's
        connection is broken.
        """
        try:
            channel = await self.agent.open_tcp(self._port, timeout_s=self._timeout_s)
        except Conflict as error:  # the agent's 502 connect_failed
            raise BrowserUnavailable(
                "the session's browser does not accept DevTools connections "
                f"({error.message}); if it just exited, the session restarts it: retry shortly"
            ) from None
        except Timeout:
            raise Timeout(
                f"the browser's DevTools did not accept a connection in {self._timeout_s:g} s"
            ) from None
        return DevtoolsSocket(self._bridges.add(channel), f"127.0.0.1:{self._port}")

    async def close(self) -> None:
        """End every open connection (the session ends)."""
        await self._bridges.close()
