"""One session's desktop: a sandbox of an engine, and the host's one stream to its agent.

The engine makes the sandbox and opens a byte stream to the agent inside
(engines/base.py); everything else goes over that stream: actions, screenshots and the
paused frame (agent/desktop.py), exec and files (agent/sandbox_io.py), the live view
(x11vnc started by the agent, agent/vnc.py) and DevTools (agent/devtools_channels.py). The
host speaks no X11 to a desktop and shares no memory with one.

A checkpoint cannot carry a stream that leads out of the sandbox: the stream is closed
before every checkpoint and opened anew after every restore, and each copy of a fork
opens its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Sequence
from pathlib import Path
from typing import Any, Generic

from ..agent.client import AgentClient
from ..agent.desktop import AgentDesktop, PackedFrame
from ..agent.devtools import DevtoolsSocket
from ..agent.devtools_channels import AgentDevtools
from ..agent.exec_slots import ExecSlots
from ..agent.limits import AgentLimits
from ..agent.sandbox_io import AgentSandboxIO
from ..agent.vnc import AgentVnc
from ..agent.vnc_server import VncServer
from ..engines.base import Capability, Engine, S, SessionSpec, SnapshotInfo
from ..errors import BrowserUnavailable, Conflict, DeskboxError, DesktopFailed
from ..media import EncodedImage
from ..sandbox_io import ExecCommand, ExecResult, FileDownload
from ..schemas import actions as a
from ..schemas.pause import PauseMode
from ..schemas.results import BatchResult

__all__ = ["AGENT_FAILURE_GRACE_S", "DEFAULT_CALL_TIMEOUT_S", "AnyDesktop", "Desktop"]

AGENT_FAILURE_GRACE_S = 3.0  # see Desktop.failure
DEFAULT_CALL_TIMEOUT_S = 30.0  # the base deadline of a desktop call (settings.py)
# A checkpoint waits this long at most for the agent to note the screen (Desktop._mark).
_MARK_TIMEOUT_S = 2.0
log = logging.getLogger("deskbox.sessions")


class Desktop(Generic[S]):
    """A sandbox and the host's connection to its agent (None while it has none: a
    checkpointed sandbox, or one being checkpointed)."""

    def __init__(
        self, engine: Engine[S], sandbox: S, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    ) -> None:
        self.engine = engine
        self.sandbox = sandbox
        self.call_timeout_s = call_timeout_s
        self.agent: AgentClient | None = None
        self._desktop: AgentDesktop | None = None
        self._agent_failed_at: float | None = None
        self._devtools: AgentDevtools | None = None  # of the current agent connection
        self._io: AgentSandboxIO | None = None
        # The session's commands and file transfers share one sandbox: at most max_execs.
        self.exec_slots = ExecSlots(sandbox.max_execs, sandbox.label)

    # -- making one -----------------------------------------------------------------------

    @classmethod
    async def start(
        cls, engine: Engine[S], spec: SessionSpec, timeout_s: float,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> Desktop[S]:
        """A new sandbox, returned once its agent says the window manager runs and the
        browser has painted its window (a copy of a snapshot: once its agent answers)."""
        await asyncio.to_thread(engine.check, spec)  # it may read a snapshot's files
        started = time.monotonic()
        sandbox = await engine.create(spec, timeout_s)
        sandbox.timings["agent_listening"] = time.monotonic() - started
        desktop = cls(engine, sandbox, call_timeout_s)
        try:
            await desktop.connect()
            if spec.from_snapshot is None:
                remaining = max(0.1, timeout_s - (time.monotonic() - started))
                ready_started = time.monotonic()
                stages = await desktop.desktop.ready(True, remaining)
                sandbox.timings.update({f"ready_{k}": v for k, v in stages.items()})
                sandbox.timings["ready"] = time.monotonic() - ready_started
            # A copy's start-up is its restore and its agent's answer: it ends here too.
            remaining = max(0.1, timeout_s - (time.monotonic() - started))
            await engine.started(sandbox, remaining)
        except BaseException:
            await desktop.destroy()
            raise
        sandbox.timings["desktop"] = time.monotonic() - started
        return desktop

    @classmethod
    async def adopt(
        cls, engine: Engine[S], session_id: str, checkpointed: bool = False,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    ) -> Desktop[S]:
        """Take over a sandbox a previous server left running (connected now) or
        checkpointed (connected once restored)."""
        if checkpointed:
            sandbox = await engine.adopt_checkpointed(session_id)
            return cls(engine, sandbox, call_timeout_s)
        desktop = cls(engine, await engine.adopt(session_id), call_timeout_s)
        try:
            await desktop.connect()
        except BaseException:
            # Left as it is, and no longer this server's: the removal of orphans that
            # follows a failed adoption must not take it for one of its own sessions.
            await desktop.let_go()
            engine.forget(desktop.sandbox)
            raise
        return desktop

    # -- the agent --------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open a new stream to the sandbox's agent and drive the desktop through it
        (AgentFailed on a protocol version other than ours, naming both)."""
        limits = AgentLimits(handshake_timeout_s=self.engine.handshake_timeout_s)
        reader, writer = await self.engine.open_stream(self.sandbox, limits.read_chunk)
        self.attach(await AgentClient.connect(reader, writer, limits))

    def attach(self, agent: AgentClient | None) -> None:
        """Drive the desktop through ``agent`` from now on (None: not at all)."""
        self.agent = agent
        self._desktop = AgentDesktop(
            agent, call_timeout_s=self.call_timeout_s, held=self.sandbox.held,
        ) if agent else None
        self._agent_failed_at = None

    @property
    def desktop(self) -> AgentDesktop:
        if self._desktop is None:
            raise DesktopFailed(f"{self.sandbox.label} is not running")
        self._refuse_if_held()
        return self._desktop

    def live_agent(self) -> AgentClient:
        agent = self.agent
        if agent is None or not self.sandbox.running:
            raise DesktopFailed(f"{self.sandbox.label} is not running")
        self._refuse_if_held()
        return agent

    def held(self) -> str | None:
        """Why someone else paused the sandbox (engines/base.py Sandbox.held), or None."""
        return self.sandbox.held()

    def end_calls(self) -> None:
        """Calls waiting on the agent now are answered at once, as at their deadline: 409
        while :meth:`held` says why (agent/desktop.py), instead of waiting out a deadline
        that would fail the session."""
        if self.agent is not None:
            self.agent.end_calls_now()

    def _refuse_if_held(self) -> None:
        """A sandbox someone else paused answers nothing: a call would wait out its
        deadline and then fail the session, which goes on once unpaused."""
        if (held := self.held()) is not None:
            raise Conflict(held)

    async def let_go(self, for_checkpoint: bool = False) -> None:
        """Close the host's stream to the agent and leave the sandbox as it is (before a
        checkpoint, or a server that stops and leaves it to the next one). Before a
        checkpoint, the agent is given a moment to close its end too (CRIU cannot dump a
        connection to the outside, even a half-closed one)."""
        agent, self.agent, self._desktop = self.agent, None, None
        devtools, self._devtools = self._devtools, None
        if devtools is not None:
            await devtools.close()
        if agent is not None:
            await agent.close(for_checkpoint and self.engine.stream_ends_with_agent)

    async def hand_over(self) -> None:
        """Another server of the fleet serves this desktop from now on: close our stream
        and stop following the sandbox, leaving it running."""
        await self.let_go()
        self.engine.forget(self.sandbox)

    def failure(self) -> str | None:
        """Why the desktop is broken (a process died, its agent stopped answering), or None
        while it is healthy. Cheap: the reaper calls it from the event loop."""
        failure = self.sandbox.failure()
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
        return f"{self.sandbox.label}'s agent failed: {agent.failed_reason}"

    # -- actions and screenshots --------------------------------------------------------------

    async def run(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
    ) -> BatchResult:
        """The batch, within its deadline (settle.py); past it the desktop counts as stalled
        (DesktopFailed, and :meth:`failure` says so from then on)."""
        return await self.desktop.run(actions, view, screenshot)

    async def grab(self) -> PackedFrame:
        """The whole screen, now, as its agent sent it (unpacked, the last frame of a
        paused session)."""
        return await self.desktop.grab_packed()

    async def watch(self, timeout_s: float, quality: int, now: bool = False,
                    ) -> EncodedImage | None:
        """The screen as JPEG once it changed since the last watch (or now); None if not."""
        return await self.desktop.watch(timeout_s, quality, now)

    # -- exec and files: inside the sandbox, through its agent ----------------------------

    def _sandbox_io(self, needed_for: str) -> AgentSandboxIO:
        self.engine.require(Capability.EXEC, needed_for)
        agent = self.live_agent()
        if self._io is None or self._io.client is not agent:
            env, cwd = self.sandbox.exec_environment()
            self._io = AgentSandboxIO(agent, env, cwd, self.exec_slots)
        return self._io

    async def exec(self, command: ExecCommand) -> ExecResult:
        """Run ``command`` inside the sandbox, as its processes run, with DISPLAY set."""
        return await self._sandbox_io("exec").run(command)

    async def read_file(self, path: str, limit: int) -> FileDownload:
        """Open the absolute ``path`` as the sandbox resolves it; FileTooLarge over ``limit``."""
        return await self._sandbox_io("reading files").read_file(path, limit)

    async def write_file(self, path: str, chunks: AsyncIterable[bytes], limit: int) -> int:
        """Replace ``path`` inside the sandbox with ``chunks`` (at most ``limit`` bytes)."""
        return await self._sandbox_io("writing files").write_file(path, chunks, limit)

    # -- the live view and DevTools: byte channels of the agent's stream ------------------

    async def tap_keysym(self, keysym: int) -> bool:
        """A live viewer's key typed by the agent; False if it cannot (AgentDesktop)."""
        return await self.desktop.tap_keysym(keysym)

    async def start_vnc(self) -> VncServer:
        """x11vnc on the desktop, started and reached through its agent; only the host
        reaches it (agent/vnc_server.py)."""
        return await AgentVnc.start(
            self.live_agent(), self.sandbox.agent_display, self.sandbox.vnc_socket_dir
        )

    async def open_devtools(self) -> DevtoolsSocket:
        """A new connection to the browser's DevTools server (agent/devtools.py);
        BrowserUnavailable while the browser does not accept connections."""
        agent = self.agent
        if agent is None or self.sandbox.failure() is not None:
            raise BrowserUnavailable(f"{self.sandbox.label} is not running")
        self._refuse_if_held()
        devtools = self._devtools
        if devtools is None or devtools.agent is not agent:  # a new agent after a restore
            if devtools is not None:
                await devtools.close()
            devtools = self._devtools = AgentDevtools(agent, self.sandbox.devtools_port)
        return await devtools.open()

    # -- pause, checkpoints and the end ------------------------------------------------

    async def claimed(self) -> None:
        """This pool desktop became a caller's session (the engine may mark its sandbox)."""
        await self.engine.claimed(self.sandbox)

    @property
    def can_freeze(self) -> bool:
        return Capability.FREEZE in self.engine.capabilities

    def require_pause(self, mode: PauseMode) -> None:
        """EngineLacks (422) unless the engine can pause this way: asked before the pause
        changes anything (its state, the watch, the viewers' and DevTools' connections)."""
        if mode == "freeze":
            self.engine.require(Capability.FREEZE, 'pause mode "freeze"')
        else:
            self.engine.require(Capability.CHECKPOINT, 'pause mode "hibernate"')

    def require_checkpoint(self) -> None:
        """EngineLacks (422) unless the engine can checkpoint: before a snapshot or a fork
        changes anything."""
        self.engine.require(Capability.CHECKPOINT, "snapshots and forks")

    async def freeze(self) -> None:
        """Stop every process where it stands (pause mode "freeze"); no call reaches the
        agent until :meth:`thaw`."""
        self.require_pause("freeze")
        await self.engine.freeze(self.sandbox)

    async def thaw(self) -> None:
        await self.engine.thaw(self.sandbox)

    async def hibernate(self) -> None:
        """Checkpoint the sandbox to disk; its processes end (pause mode "hibernate")."""
        self.require_pause("hibernate")
        await self._mark()
        await self.let_go(for_checkpoint=True)
        try:
            await self.engine.checkpoint(self.sandbox)
        except BaseException:
            await self._reconnect_after_failure()
            raise

    async def restore(self) -> None:
        """Bring a hibernated sandbox back, with its agent connected again."""
        await self.engine.restore(self.sandbox)
        await self._connect_again()

    async def snapshot(self, directory: Path, packed: bool = True) -> SnapshotInfo:
        """Checkpoint the running sandbox into the new ``directory``; it runs on, with a
        new stream to its agent."""
        self.require_checkpoint()
        await self._mark()
        await self.let_go(for_checkpoint=True)
        try:
            return await self.engine.snapshot(self.sandbox, directory, packed)
        finally:
            await self._connect_again()

    async def _connect_again(self) -> None:
        """A new stream to the agent of a sandbox just restored or saved; then what only
        that needed (the vm engine's CPU boost) ends, connected or not: a sandbox left
        running must not keep it."""
        try:
            await self.connect()
        finally:
            await self.engine.started(self.sandbox, self.call_timeout_s)

    async def _mark(self) -> None:
        """Have the agent note the screen before a checkpoint: Chromium repaints every
        page, pixel for pixel the same, once its processes run again, and the first look
        after a restore would otherwise wait out a quiet window for that (~0.1 s of a
        reset). Best effort: the checkpoint goes on without it; the stream is closed next
        anyway."""
        desktop, agent = self._desktop, self.agent
        if desktop is None or agent is None or "mark" not in agent.hello_info.calls:
            return
        try:
            async with asyncio.timeout(_MARK_TIMEOUT_S):
                await desktop.mark()
        except (DeskboxError, TimeoutError) as error:
            log.info("%s: the screen was not noted before the checkpoint: %s",
                     self.sandbox.label, getattr(error, "message", "no answer"))

    async def _reconnect_after_failure(self) -> None:
        if self.sandbox.running:  # the checkpoint failed and left it running
            await self.connect()

    async def release(self) -> None:
        """At server shutdown: a checkpointed sandbox is left for the next server (its
        checkpoint kept), any other destroyed."""
        if self.sandbox.running:
            await self.destroy()
            return
        await self.let_go()
        await self.engine.release(self.sandbox)

    async def destroy(self) -> None:
        """Stop the sandbox (engine.stop: briefly, where it has volumes), kill it, then
        close the agent's stream, then remove the rest.

        Never waits on the agent: a stopped or frozen agent answers nothing, and a call
        waiting on it ends when its stream does.
        """
        try:
            await self.engine.stop(self.sandbox)
            await self.engine.kill(self.sandbox)
        except Exception as error:
            # A container engine that does not answer: the removal below is tried all the
            # same, and it is what says whether the sandbox is gone (it raises if not).
            log.warning("%s: stopping it failed (%s); removing it all the same",
                        self.sandbox.label, getattr(error, "message", repr(error)))
        try:
            await self.let_go()
        finally:  # a stream that fails to close must not leave the sandbox behind
            await self.engine.destroy(self.sandbox)


AnyDesktop = Desktop[Any]
