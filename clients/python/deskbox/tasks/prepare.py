"""A task's setup, run on a new desktop: files, then commands, then the start page."""

from __future__ import annotations

from pathlib import PurePosixPath

from .. import cdp
from .._sync import Session
from .model import Command, Task, TaskError

__all__ = ["prepare"]


def prepare(session: Session, task: Task) -> None:
    """Bring ``session`` (made from ``task.setup.snapshot`` if it names one) to the task's
    start state. A command that fails, or a page that does not load, is a :class:`TaskError`:
    an episode must not start from a state its task did not mean."""
    setup = task.setup
    # Uploads write files, not directories: the ones the task's files go in are made first.
    folders = sorted({str(PurePosixPath(file.path).parent) for file in setup.files})
    if folders:
        _run(session, task, Command(cmd=["mkdir", "-p", *folders]))
    for file in setup.files:
        if file.source is not None:
            path = task.base_dir / file.source
            try:
                data = path.read_bytes()
            except OSError as error:
                raise TaskError(f"task {task.id}: file {path}: {error.strerror}") from error
        else:
            data = (file.content or "").encode()
        session.upload(file.path, data)
    for command in setup.exec:
        _run(session, task, command)
    if setup.start_url is not None:
        try:
            cdp.navigate(session, setup.start_url)
        except cdp.DevToolsError as error:
            raise TaskError(f"task {task.id}: start page: {error}") from error


def _run(session: Session, task: Task, command: Command) -> None:
    result = session.exec(command.cmd, timeout_s=command.timeout_s,
                          background=command.background)
    if not command.background and result.exit_code != 0:
        raise TaskError(
            f"task {task.id}: setup command {command.cmd} "
            + ("timed out" if result.timed_out else f"exited {result.exit_code}")
            + f": {result.stderr.strip()[-500:]}")
