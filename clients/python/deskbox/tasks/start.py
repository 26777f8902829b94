"""Tasks' start states as snapshots: set a task up once, then reset from copies of it.

The first desktop of a task is made as any other (a new desktop, the setup, a settled
screen) and snapshotted; the snapshot keeps ``pool`` restored copies ready. Every later
desktop of the task is a create ``from_snapshot``: a claim of a ready copy (tens of
milliseconds) or, when none is ready, a restore (about a second), with no setup to run.
One :class:`StartStates` can serve many environments at once (``deskbox eval --pool``):
the first to need a task's snapshot makes it, the others wait for it.

A pool the server refuses (past the key's cap: the copies of all of a key's snapshots count
against its session cap, API.md "Warm pool") leaves nothing behind: the desktop and the
snapshot just made are deleted, and the refusal is raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from .._errors import DeskboxError
from .._sync import Deskbox, Session
from .model import Task
from .prepare import prepare

__all__ = ["StartStates", "task_desktop"]

# A small screenshot: settling is what is asked for, not the picture.
_LOOK = {"format": "jpeg", "quality": 10, "scale": {"width": 64, "height": 40}}
_SETTLE_S = 10.0


class StartStates:
    def __init__(self, client: Deskbox, pool: int = 2) -> None:
        if not 0 <= pool <= 4:
            raise ValueError("pool must be 0 to 4 (restored copies kept ready per task)")
        self.client = client
        self.pool = pool
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self._snapshots: dict[str, str] = {}

    def desktop(self, task: Task, create_args: Mapping[str, Any]) -> tuple[Session, bool]:
        """A running desktop in ``task``'s start state, and whether it is the one set up
        just now (else a copy, which has been still since it was restored)."""
        key = f"{task.id} {sorted(create_args.items())!r}"
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        with building:
            snapshot = self._snapshots.get(key)
            if snapshot is None:
                session = self._first(task, create_args)
                try:
                    # Kept only once its pool is set: a snapshot whose pool was refused
                    # would start the next episodes without one, then outlive a close
                    # that failed before reaching it.
                    self._snapshots[key] = self._start_state(session)
                except BaseException:  # e.g. an engine without checkpoints: a 422 naming it
                    session.close()
                    raise
                return session, True
        return self.client.sessions.create(**{**create_args, "from_snapshot": snapshot}), False

    def _start_state(self, session: Session) -> str:
        """A snapshot of ``session`` with its pool set; deleted if the pool is refused."""
        snapshot = session.snapshot().id
        try:
            self.client.snapshots.set_pool(snapshot, self.pool)
        except BaseException as refused:
            try:
                self.client.snapshots.delete(snapshot)
            except DeskboxError as failed:
                refused.add_note(f"and its snapshot {snapshot} could not be deleted: {failed}")
            raise
        return snapshot

    def _first(self, task: Task, create_args: Mapping[str, Any]) -> Session:
        session = self.client.sessions.create(**create_args)
        try:
            prepare(session, task)
            deadline = time.monotonic() + _SETTLE_S
            while not session.act([{"type": "wait", "ms": 0}], screenshot=_LOOK).settled:
                if time.monotonic() > deadline:
                    break  # snapshotted as it is: the env's own settling reports it
        except BaseException:
            session.close()
            raise
        return session

    def close(self) -> None:
        """Delete the snapshots (and so their ready copies). Every delete is tried; a
        :class:`~deskbox.DeskboxError` naming each snapshot that could not be deleted, and
        why, is raised after them."""
        with self._lock:
            snapshots, self._snapshots = list(self._snapshots.values()), {}
        failed: dict[str, DeskboxError] = {}
        for snapshot in snapshots:
            try:
                self.client.snapshots.delete(snapshot)
            except DeskboxError as error:
                failed[snapshot] = error
        if failed:
            named = "; ".join(f"{snapshot}: {error}" for snapshot, error in failed.items())
            raise DeskboxError(f"{len(failed)} of {len(snapshots)} start states' snapshots "
                               f"could not be deleted ({named})") from next(iter(failed.values()))


def task_desktop(client: Deskbox, task: Task, create_args: Mapping[str, Any],
                 start_states: StartStates | None) -> tuple[Session, bool]:
    """A running desktop in ``task``'s start state, and whether it was set up just now
    (else a copy of a start state, still since its restore): from ``start_states`` if
    given, else a new desktop and the task's setup. A failed setup deletes the desktop."""
    if start_states is not None:
        return start_states.desktop(task, create_args)
    session = client.sessions.create(**create_args)
    try:
        prepare(session, task)
    except BaseException:
        session.close()
        raise
    return session, True
