"""A desktop driven through its agent (``deskbox-agent``, desktop_image/agent/): what every
backend's handle shares, whatever runs the desktop (a runc sandbox, host processes).

Actions, screenshots and the paused frame go over the agent's stream (AgentDesktop), and so
do the live view (x11vnc, started by the agent: agent_vnc.py) and DevTools (TCP channels:
agent_devtools.py). The host speaks no X11 to the desktop and shares no memory with it.
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence

from ..agent.client import AgentClient
from ..agent.desktop import AgentDesktop
from ..errors import BrowserUnavailable, DesktopFailed
from ..media import Frame
from ..schemas import actions as a
from ..schemas.results import BatchResult
from .agent_devtools import AgentDevtools
from .agent_vnc import AgentVnc
from .base import DesktopHandle
from .devtools import DEVTOOLS_PORT, DevtoolsSocket
from .vnc_server import VncServer

__all__ = ["AGENT_FAILURE_GRACE_S", "DEFAULT_CALL_TIMEOUT_S", "AgentHandle"]

AGENT_FAILURE_GRACE_S = 3.0  # see AgentHandle.failure
DEFAULT_CALL_TIMEOUT_S = 30.0  # the base deadline of a desktop call (settings.py)


class AgentHandle(DesktopHandle):
    """A desktop and the host's one connection to its agent (None while it has none: a
    checkpointed sandbox). Subclasses say what the desktop is and how its processes fare."""

    def __init__(
        self, agent: AgentClient | None, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self._agent_failed_at: float | None = None
        self.agent: AgentClient | None = None
        self._desktop: AgentDesktop | None = None
        self._devtools: AgentDevtools | None = None  # of the current agent connection
        self.attach(agent)

    # -- what a backend says about its desktop ------------------------------------------

    @property
    @abstractmethod
    def label(self) -> str:
        """The desktop in messages: "the sandbox ID", "the desktop :N"."""

    @abstractmethod
    def processes_failure(self) -> str | None:
        """Why the desktop's processes are broken (one exited), or None; cheap."""

    @property
    def running(self) -> bool:
        """Whether the desktop's processes run (a checkpointed sandbox's do not)."""
        return True

    @property
    @abstractmethod
    def vnc_display(self) -> str:
        """The X display as the agent names it (``:N``)."""

    @property
    @abstractmethod
    def vnc_socket_dir(self) -> str:
        """A directory, as the agent sees it, where x11vnc may put its socket."""

    @property
    def devtools_port(self) -> int:
        """The browser's DevTools port, as the agent reaches it (its loopback)."""
        return DEVTOOLS_PORT

    # -- the agent ----------------------------------------------------------------------

    def attach(self, agent: AgentClient | None) -> None:
        """Drive the desktop through ``agent`` from now on (None: not at all)."""
        self.agent = agent
        self._desktop = AgentDesktop(agent, call_timeout_s=self.call_timeout_s) if agent else None
        self._agent_failed_at = None

    @property
    def desktop(self) -> AgentDesktop:
        if self._desktop is None:
            raise DesktopFailed(f"{self.label} is not running")
        return self._desktop

    async def run(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        return await self.desktop.run(actions, view, screenshot)

    async def grab(self) -> Frame:
        return await self.desktop.grab()

    async def let_go(self) -> None:
        agent, self.agent, self._desktop = self.agent, None, None
        devtools, self._devtools = self._devtools, None
        if devtools is not None:
            await devtools.close()
        if agent is not None:
            await agent.close()

    def failure(self) -> str | None:
        failure = self.processes_failure()
        agent = self.agent
        if failure is not None or agent is None or agent.failed_reason is None:
            return failure
        # The agent's stream also ends when the whole desktop does (its X server exited, it
        # was killed): its processes end first, and a sandbox's init exits up to 2 s later.
        # That exit is the better reason, so the agent's own waits a moment for it.
        now = time.monotonic()
        if self._agent_failed_at is None:
            self._agent_failed_at = now
        if now - self._agent_failed_at < AGENT_FAILURE_GRACE_S:
            return None
        return f"{self.label}'s agent failed: {agent.failed_reason}"

    def live_agent(self) -> AgentClient:
        agent = self.agent
        if agent is None or not self.running:
            raise DesktopFailed(f"{self.label} is not running")
        return agent

    # The live view and DevTools: byte channels of the agent's stream (agent_vnc.py,
    # agent_devtools.py); the host reaches no socket of the desktop's by itself.

    async def start_vnc(self) -> VncServer:
        """x11vnc on the desktop, started and reached through its agent."""
        return await AgentVnc.start(self.live_agent(), self.vnc_display, self.vnc_socket_dir)

    async def open_devtools(self) -> DevtoolsSocket:
        if self.agent is None or self.processes_failure() is not None:
            raise BrowserUnavailable(f"{self.label} is not running")
        devtools = self._devtools
        if devtools is None or devtools.agent is not self.agent:  # a new agent after a restore
            if devtools is not None:
                await devtools.close()
            devtools = self._devtools = AgentDevtools(self.agent, self.devtools_port)
        return await devtools.open()
