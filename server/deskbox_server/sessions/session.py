"""One session as the API sees it: the one door through which a request reaches a desktop.

``api/`` asks the manager (manager.py, the table of sessions) for a :class:`Session` and
calls it: actions, screenshots, exec and files, the live view, DevTools, pause, resume and
checkpoints. The Session checks the session's state, keeps its bookkeeping (busy count,
idle clock, metrics, failing it when its desktop breaks) and delegates the work to the
session's desktop (desktop.py); pause, resume and checkpoints are in state_changes.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Literal

from websockets.asyncio.client import ClientConnection

from ..agent.devtools import MAX_LISTING, browser_path, get_json, open_websocket
from ..agent.vnc_server import VncServer
from ..engines.base import SnapshotInfo
from ..errors import Conflict, DeskboxError, SessionFailed
from ..media import EncodedImage
from ..sandbox_io import ExecCommand, ExecResult, FileDownload
from ..schemas import actions as a
from ..schemas.handoff import Handoff
from ..schemas.pause import PauseMode
from ..schemas.results import ActionResult, BatchResult, ClipboardText
from ..schemas.sessions import SessionState as S
from . import secret_typing, state_changes
from .context import SessionContext
from .desktop import AnyDesktop
from .handoff import HandoffState
from .lifecycle import SessionRecord
from .live import LiveSession, not_live, one_server_only
from .pause import frozen_image
from .recorder import Source
from .recording_store import RecordingMeta
from .secrets import redact

__all__ = ["Session"]


class Session:
    """A live session of this server; made by ``SessionManager.session`` for one caller."""

    def __init__(self, live: LiveSession, context: SessionContext) -> None:
        self._live = live
        self._context = context

    @property
    def record(self) -> SessionRecord:
        return self._live.record

    @property
    def handle(self) -> AnyDesktop:
        """The desktop of this running session (for tests, and the table's own use)."""
        return self._running()

    def _running(self) -> AnyDesktop:
        live = self._live
        if live.record.state is not S.running or live.handle is None:
            raise not_live(live.record)
        if live.checkpointing:
            raise Conflict(
                f"session {live.record.id} is being checkpointed (snapshot or fork); try "
                "again in a moment"
            )
        return live.handle

    def ensure_running(self) -> None:
        """Conflict (or the reason it ended) unless the session runs and takes actions."""
        self._running()

    def touch(self) -> None:
        """Note use that goes around :meth:`act` (CDP traffic): the reaper counts its idle
        time from now."""
        self._running()
        self._live.record.touch()

    # -- actions and screenshots ----------------------------------------------------------

    async def act(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None = None,
        screenshot: a.Screenshot | None = None,
        check: Callable[[], None] | None = None,
    ) -> BatchResult:
        """Run a batch of actions. Calls reach the desktop in the order they arrive (the
        websocket relies on it): everything up to the handle's call is synchronous, except
        behind a batch that types a secret, which checks the browser's focus first; later
        batches then wait their turn (:meth:`_in_line`).

        ``check`` refuses the whole batch before any of it runs (a vendor call's points,
        API.md "Vendor dialects"): a refusal the recording keeps, as the desktop's own."""
        source = {"type": "api_key", "id": self._live.record.owner}

        async def run() -> BatchResult:
            if check is not None:
                check()
            return await self._act(actions, view, screenshot)

        return await self._recorded(source, actions, view, run)

    def refused(
        self, sent: object, actions: Sequence[dict[str, object]] | None, error: DeskboxError,
        dialect: str | None = None,
    ) -> None:
        """A call of the agent's refused for its input before it became actions, kept if
        the session records (recorder.py ``refused``): a recording has every call, refused
        ones included (API.md "Recordings and trajectories"), not only those the desktop
        refused."""
        recorder = self._context.recordings.recorder(self._live.record.id)
        if recorder is not None:
            recorder.refused({"type": "api_key", "id": self._live.record.owner}, sent, actions,
                             error, dialect)

    async def _recorded(
        self, source: Source, actions: Sequence[a.Action], view: a.CoordinateSpace | None,
        run: Callable[[], Awaitable[BatchResult]],
    ) -> BatchResult:
        """``run()``, the batch it runs kept as ``source``'s if the session records."""
        recorder = self._context.recordings.recorder(self._live.record.id)
        if recorder is None:
            return await run()
        started = recorder.now()
        space = view or self._live.record.body.coordinate_space
        try:
            result = await run()
        except DeskboxError as error:
            recorder.batch(source, actions, space, started, None, error)
            raise
        recorder.batch(source, actions, space, started, result, None)
        return result

    async def _act(
        self,
        actions: Sequence[a.Action],
        view: a.CoordinateSpace | None,
        screenshot: a.Screenshot | None,
    ) -> BatchResult:
        live = self._live
        if live.handoff is not None:
            live.handoff.check(actions)
        secret = any(isinstance(action, a.TypeText) and action.secret for action in actions)
        if secret or (live.last_in_line is not None and not live.last_in_line.done()):
            return await self._in_line(actions, view, screenshot, secret)
        return await self._run(self._running(), actions, view, screenshot)

    async def _in_line(
        self, actions: Sequence[a.Action], view: a.CoordinateSpace | None,
        screenshot: a.Screenshot | None, secret: bool,
    ) -> BatchResult:
        """Wait for the batch ahead, then hand this one to the desktop and let the next one
        go once the handoff has begun (the desktop's call is started as a task; the next
        batch's wait ends after that task's first step, in loop order).

        A batch that types secrets runs in parts, each secret starting one: the focus is
        checked when its turn comes (after a click before it in the batch, say), and the
        next batch waits until the last part's handoff.
        """
        live = self._live
        ahead, mine = live.last_in_line, asyncio.get_running_loop().create_future()
        live.last_in_line = mine
        loop = asyncio.get_running_loop()
        done: list[ActionResult] = []
        counted = False
        try:
            if ahead is not None:
                await asyncio.shield(ahead)
            handle = self._running()
            # In flight from here, its focus checks too: a pause or checkpoint waits for
            # it (drain) rather than stop the desktop between a check and the typing.
            live.busy += 1
            counted = True
            store, owner = self._context.secrets, live.record.owner
            await secret_typing.check_names(store, owner, actions)
            cut = secret_typing.parts(actions) if secret else [list(actions)]
            for part in cut[:-1]:
                with _failing_at(len(done)):
                    part = await secret_typing.typed(store, owner, part, handle.open_devtools)
                with _counted_from(len(done)):
                    done += (await self._run(handle, part, view, None)).results
            with _failing_at(len(done)):
                last = await secret_typing.typed(store, owner, cut[-1], handle.open_devtools)
            call = asyncio.ensure_future(self._run(handle, last, view, screenshot))
        except BaseException:
            if counted:
                live.busy -= 1
            raise
        finally:
            loop.call_soon(_release, mine)
        try:
            with _counted_from(len(done)):
                result = await call
        finally:
            live.busy -= 1
        return BatchResult(done + result.results, result.screenshot, result.settled)

    async def _run(
        self, handle: AnyDesktop, actions: Sequence[a.Action], view: a.CoordinateSpace | None,
        screenshot: a.Screenshot | None,
    ) -> BatchResult:
        live, metrics = self._live, self._context.metrics
        view = view or live.record.body.coordinate_space
        kind = actions[0].type if actions else "none"
        live.busy += 1
        started = time.perf_counter()
        try:
            result = await handle.run(actions, view, screenshot)
        except SessionFailed as error:
            metrics.actions.inc(kind, "error", amount=len(actions) or 1)
            if (ended := await self._context.fail(live, error.message)) is not None:
                raise ended from None
            raise
        except DeskboxError:
            metrics.actions.inc(kind, "error")
            raise
        finally:
            live.busy -= 1
            if live.record.state is S.running:
                live.record.touch()
        metrics.action_seconds.observe(time.perf_counter() - started, kind)
        for action in actions:
            metrics.actions.inc(action.type, "ok")
            if isinstance(action, a.Screenshot | a.Zoom):
                metrics.screenshots.inc(action.format)
        if screenshot is not None:
            metrics.screenshots.inc(screenshot.format)
        return result

    async def screenshot(
        self,
        fmt: Literal["jpeg", "png", "webp"],
        quality: int,
        scale: a.ScaleTo | None = None,
    ) -> tuple[EncodedImage, bool]:
        """The screen, and whether it is frozen: a paused or hibernated session's X server
        answers nothing, so its last frame (taken when it was paused) stands in for it."""
        live = self._live
        shot = a.Screenshot(format=fmt, quality=quality, scale=scale)
        frozen = live.record.state in (S.paused, S.hibernated)
        if frozen:
            # Recorded as any look of the agent's is (API.md "Recordings and trajectories").
            source = {"type": "api_key", "id": live.record.owner}
            batch = await self._recorded(source, [shot], None, lambda: self._frozen(shot))
        else:
            batch = await self.act([shot])
        result = batch.results[0]
        if not isinstance(result, EncodedImage):
            raise TypeError(f"a screenshot answered {type(result).__name__}")
        return result, frozen

    async def _frozen(self, shot: a.Screenshot) -> BatchResult:
        """``shot`` of a paused session: its last frame, taken when it was paused."""
        live = self._live
        last = live.last_frame
        if last is None:  # still pausing: the screen is not frozen yet
            raise Conflict(f"session {live.record.id} is being paused; try again in a moment")
        view = live.record.body.coordinate_space
        image = await asyncio.to_thread(
            frozen_image, last, shot.format, shot.quality, view, shot.scale)
        return BatchResult([image], None, True)

    # -- exec and files (the sandbox's) ---------------------------------------------------

    @asynccontextmanager
    async def _using(self) -> AsyncIterator[AnyDesktop]:
        """The handle, marked busy (never reaped) while in use; a SessionFailed raised
        inside fails the session."""
        handle = self._running()
        live = self._live
        live.busy += 1
        try:
            yield handle
        except SessionFailed as error:
            if (ended := await self._context.fail(live, error.message)) is not None:
                raise ended from None
            raise
        finally:
            live.busy -= 1
            if live.record.state is S.running:
                live.record.touch()

    def _one_server(self, what: str) -> None:
        if self._context.registry.shared:
            raise one_server_only(what)

    # -- a human's control and the agent's requests for help (handoff.py) ----------------

    @property
    def handoff(self) -> HandoffState:
        live = self._live
        if live.handoff is None:
            events, session_id = self._context.events, live.record.id
            live.handoff = HandoffState(
                lambda kind, **fields: events.publish(session_id, kind, **fields))
        return live.handoff

    def take_control(self, lease_s: int, holder: str) -> Handoff:
        """A human (``holder``: their control token's id, or the owner's key) drives the
        running session until they hand it back or ``lease_s``."""
        self._one_server("a human's control")
        self._running()
        self.handoff.take(lease_s, holder)
        return self.handoff.resource()

    def hand_back(self) -> Handoff:
        self.handoff.hand_back()
        return self.handoff.resource()

    async def ask_for_help(self, reason: str, wait_s: float | None) -> Handoff:
        """Tell humans the agent needs one; with ``wait_s``, answer once a human has taken
        control and handed back (or after ``wait_s``)."""
        self._one_server("asking for help")
        self._running()
        self.handoff.ask(reason)
        if wait_s is not None:
            await self.handoff.wait_handed_back(wait_s)
            # The session's end lets the wait go: no human came, the session is gone.
            record = self._live.record
            if record.state is S.failed:
                raise not_live(record)
            if record.state in (S.stopping, S.stopped):
                raise Conflict(f"session {record.id} was stopped while the call ran")
        return self.handoff.resource()

    # -- recording (recordings.py) ----------------------------------------------------------

    async def start_recording(self) -> RecordingMeta:
        """Record from now on (frames while it runs); it goes on if it records already."""
        self._one_server("recording")
        live = self._live
        if live.record.state not in (S.running, S.paused, S.hibernated):
            raise not_live(live.record)
        return await self._context.recordings.begin(live.record, live.handle)

    async def stop_recording(self) -> RecordingMeta:
        record = self._live.record
        meta = await self._context.recordings.end(record.id)
        return meta or self._context.recordings.store.owned(record.owner, record.id)

    # -- the live view's clipboard panel ---------------------------------------------------

    async def viewer_clipboard(self) -> str:
        """The session's clipboard for a viewer's panel: the whole text, where RFB's cut
        text carries Latin-1 only."""
        result = (await self._run(self._running(), [a.ClipboardGet()], None, None)).results[0]
        return result.text if isinstance(result, ClipboardText) else ""

    async def viewer_paste(self, text: str, source: Source) -> None:
        """A control viewer's text onto the session's clipboard. The human's doing: it
        goes through while a human holds control, as the viewer's keys and clicks do;
        recorded as ``source``'s ``clipboard_set``."""
        await self._viewers(source, a.ClipboardSet(text=text))

    async def viewer_type(self, text: str, source: Source) -> None:
        """A control viewer's text typed into the focused window (the panel's "Type"): text
        the page cannot send as keys (an input method's, any script) and places a paste does
        not reach (a terminal, a field that refuses pastes). The human's doing, as
        :meth:`viewer_paste`; recorded as ``source``'s ``type``."""
        await self._viewers(source, a.TypeText(text=text))

    async def _viewers(self, source: Source, action: a.Action) -> None:
        """A viewer's action: no handoff check and no place in the agent's line."""
        actions = [action]
        await self._recorded(source, actions, None,
                             lambda: self._run(self._running(), actions, None, None))

    async def viewer_key(self, keysym: int) -> bool:
        """A control viewer's press of a key that types a character off the layout, typed
        by the agent (PROTOCOL.md ``tap_keysym``); False if its agent cannot, and the VNC
        server is to press it. The human's doing, not the agent's: no handoff check."""
        return await self._running().tap_keysym(keysym)

    def human_input(self, viewer_id: str, source: Source, message: bytes) -> None:
        """A control viewer's input message, kept if the session records. A human's input
        is use of the session, as the API's is: it keeps the idle timeout away."""
        self._live.record.touch()
        recorder = self._context.recordings.recorder(self._live.record.id)
        if recorder is not None:
            recorder.human(viewer_id, source, message)

    def human_left(self, viewer_id: str) -> None:
        recorder = self._context.recordings.recorder(self._live.record.id)
        if recorder is not None:
            recorder.human_left(viewer_id)

    async def exec(self, command: ExecCommand, secrets: Sequence[str] = ()) -> ExecResult:
        """Run ``command``; ``secrets``: the API key's secrets of these names in its
        environment (this command's only), their values blanked from its output."""
        store, owner = self._context.secrets, self._live.record.owner
        records = [await asyncio.to_thread(store.get, owner, name) for name in secrets]
        values = {record.name: store.value(record) for record in records}
        if values:
            command = dataclasses.replace(command, env={**command.env, **values})
        async with self._using() as handle:
            result = await handle.exec(command)
        return redact(result, values) if values else result

    async def write_file(self, path: str, chunks: AsyncIterable[bytes], limit: int) -> int:
        async with self._using() as handle:
            return await handle.write_file(path, chunks, limit)

    @asynccontextmanager
    async def read_file(self, path: str, limit: int) -> AsyncIterator[FileDownload]:
        """The file being read; the session counts as busy until the context ends."""
        async with self._using() as handle:
            download = await handle.read_file(path, limit)
            try:
                yield download
            finally:
                await download.aclose()

    # -- the live view and DevTools (on the handle of the lookup: no state check) ---------

    def _handle(self) -> AnyDesktop:
        if self._live.handle is None:
            raise not_live(self._live.record)
        return self._live.handle

    async def start_vnc(self) -> VncServer:
        """Start a VNC server on this desktop that only the host can reach."""
        return await self._handle().start_vnc()

    async def devtools_json(self, path: str) -> object:
        """The browser's ``/json/version`` or ``/json/list`` (at most MAX_LISTING bytes)."""
        handle = self._handle()
        return await get_json(await handle.open_devtools(), path, MAX_LISTING)

    async def devtools_browser_path(self) -> str:
        """The path of the browser-level DevTools websocket."""
        return await browser_path(self._handle().open_devtools)

    async def devtools_websocket(self, path: str, max_size: int) -> ClientConnection:
        """A DevTools websocket at ``path``; larger messages than ``max_size`` close it."""
        return await open_websocket(self._handle().open_devtools, path, max_size)

    # -- pause, resume and checkpoints (state_changes.py) ---------------------------------

    async def pause(self, mode: PauseMode) -> SessionRecord:
        what = "hibernate" if mode == "hibernate" else "pause"
        return await self._context.changes.run(
            state_changes.pause(self._live, self._context, mode),
            f"{what} of session {self._live.record.id}")

    async def resume(self) -> SessionRecord:
        return await self._context.changes.run(
            state_changes.resume(self._live, self._context),
            f"resume of session {self._live.record.id}")

    def require_checkpoint(self) -> None:
        """EngineLacks (422) unless its engine can checkpoint it: before a snapshot's quota
        or a fork's capacity is even looked at."""
        self._handle().require_checkpoint()

    async def checkpoint(self, directory: Path) -> SnapshotInfo:
        """Checkpoint the running desktop into ``directory`` (a snapshot); it keeps
        running."""
        return await state_changes.checkpoint(self._live, self._context, directory)

    def copying(self, directory: Path) -> AbstractAsyncContextManager[SnapshotInfo]:
        """Checkpoint the running desktop into ``directory`` for copies made within the
        block (a fork); it keeps still until the block ends, then runs on."""
        return state_changes.copying(self._live, self._context, directory)


@contextmanager
def _counted_from(offset: int) -> Iterator[None]:
    """A part of a batch runs: the index of a failed action in it counts in the batch."""
    try:
        yield
    except DeskboxError as error:
        if error.action_index is not None:
            error.action_index += offset
        raise


@contextmanager
def _failing_at(index: int) -> Iterator[None]:
    """The focus check of the secret at ``index`` of a batch: its refusal is that action's."""
    try:
        yield
    except DeskboxError as error:
        error.action_index = index
        raise


def _release(turn: asyncio.Future[None]) -> None:
    if not turn.done():
        turn.set_result(None)

