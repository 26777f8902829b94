"""Starting and ending one session's desktop: its state changes around the desktop's
start and destruction (desktop.py). The manager (manager.py) calls them and keeps its table.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ..engines import AnyEngine, SessionSpec
from ..errors import DeskboxError, InsufficientStorage
from ..schemas.sessions import SessionState as S
from .context import SessionContext
from .desktop import DEFAULT_CALL_TIMEOUT_S, AnyDesktop, Desktop
from .lifecycle import LIVE_STATES, SessionRecord
from .live import LiveSession
from .registry import Registry

__all__ = ["end", "save_end", "start"]

log = logging.getLogger("deskbox.sessions")


async def start(
    live: LiveSession, engine: AnyEngine, spec: SessionSpec, context: SessionContext,
    timeout_s: float, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> str | None:
    """Start the session's desktop: None once it runs (or when the session was stopped
    meanwhile), else why it did not start (the caller ends the session)."""
    record = live.record
    started = time.monotonic()
    try:
        handle = await Desktop.start(engine, spec, timeout_s, call_timeout_s)
    except DeskboxError as error:
        return error.message
    except Exception as error:
        log.exception("session %s failed to start", record.id)
        return f"the desktop did not start: {type(error).__name__}"
    live.handle = handle
    if record.state is not S.starting:  # failed or being stopped meanwhile
        return None
    record.transition(S.running)
    record.touch()
    await context.registry.save(record)
    context.publish(record)
    context.watch(record.id, handle)
    if record.body.record:
        await context.recordings.begin(record, handle)
    log.info(
        "session %s running (engine %s, %.2f s; %s)",
        record.id, record.backend, time.monotonic() - started,
        ", ".join(f"{stage} {seconds:.2f} s" for stage, seconds in handle.sandbox.timings.items()),
    )
    return None


async def end(
    live: LiveSession, context: SessionContext, failure: str | None,
    stop_timeout_s: float, removals: set[asyncio.Task[None]],
) -> bool:
    """Stop (``failure`` None) or fail a session and destroy its desktop; whether its
    final record reached the registry (not on a full disk: the caller saves it later).

    Bounded: a desktop not removed within ``stop_timeout_s`` leaves the session failed (its
    removal goes on in the background, in ``removals``), never stuck in ``stopping``.
    """
    record = live.record
    saved = True
    # The state changes first, with no await before it: callers see it at once.
    if record.state in LIVE_STATES and record.state is not S.stopping:
        if failure is None:
            record.transition(S.stopping)
        else:
            record.transition(S.failed, failure)
            log.warning("session %s failed: %s", record.id, failure)
        saved = await _save(context, record)
        context.publish(record)
    await context.recordings.end(record.id, "the session ended")
    await context.unwatch(record.id)  # before the browser goes with the desktop
    if live.handoff is not None:
        live.handoff.close()
    # A resume's restore ends before the sandbox goes (within the end's bound all the same).
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(stop_timeout_s), live.restoring:
            pass
    if live.handle is None:
        context.volumes.detach(record.id)  # a start that failed removed its sandbox
    elif (reason := await _remove(
        live.handle, record.id, stop_timeout_s, removals,
        lambda: context.volumes.detach(record.id),
    )) is not None:
        log.error("session %s: %s", record.id, reason)
        if record.state is S.stopping:
            record.transition(S.failed, reason)
            saved = await _save(context, record)
            context.publish(record)
    if record.state is S.stopping:
        record.transition(S.stopped)
        saved = await _save(context, record)
        context.publish(record)
    # Last: a viewer or DevTools client that a token opened hears of the session's end
    # (1001) as its connection goes with the desktop, not of a token revoked (1008).
    context.tokens.forget_session(record.id, record.state.value)
    return saved


async def save_end(registry: Registry, record: SessionRecord) -> bool:
    """Save an ended or ending session's record; False (said in the log) when the registry
    has no room for it: the caller keeps the record in memory and saves it later (the
    manager's ``_unsaved``), as a full disk must not stop an end, nor the server's start."""
    try:
        await registry.save(record)
    except InsufficientStorage as error:
        log.error("session %s: its %s state is not saved yet: %s", record.id,
                  record.state.value, error.message)
        return False
    return True


async def _save(context: SessionContext, record: SessionRecord) -> bool:
    """``save_end``, and a registry failing otherwise must not keep the sandbox alive
    either: the end goes on, the record kept in memory."""
    try:
        return await save_end(context.registry, record)
    except Exception:
        log.exception("session %s: its %s state is not saved yet", record.id,
                      record.state.value)
        return False


async def _remove(
    handle: AnyDesktop, session_id: str, timeout_s: float,
    removals: set[asyncio.Task[None]], removed: Callable[[], None],
) -> str | None:
    """Destroy the desktop, then call ``removed`` (not if that failed); why the sandbox
    may still be there: its removal failed, or took more than ``timeout_s`` (it goes on in
    the background, and the manager's shutdown gives it one more bounded wait)."""
    problems: list[str] = []
    removal = asyncio.create_task(_destroy(handle, session_id, removed, problems))
    done, _ = await asyncio.wait({removal}, timeout=timeout_s)
    if done:
        return problems[0] if problems else None
    removals.add(removal)
    removal.add_done_callback(removals.discard)
    return f"the desktop was not removed within {timeout_s:g} s; its removal goes on"


async def _destroy(
    handle: AnyDesktop, session_id: str, removed: Callable[[], None], problems: list[str],
) -> None:
    try:
        await handle.destroy()
    except Exception as error:
        log.exception("destroying session %s", session_id)
        detail = error.message if isinstance(error, DeskboxError) else repr(error)
        problems.append(f"its sandbox could not be removed ({detail}); the next start of "
                        "the server removes it")
        # Not ``removed``: its volumes stay attached, so that no other session writes one
        # while a mount of it, or a process of the old sandbox, may still be there.
        return
    removed()
