"""``exec`` and ``files`` of a sandbox through its agent, with the
promises of API.md: exec's timeout, exit code (128 + N for signal N, 127/126 when the
program cannot be started), capped output with truncation flags, background commands;
files' size cap (FileTooLarge, 413), path checks and errors as 4xx.

Each call takes one of the session's exec slots (exec_slots.py) while it runs: the agent
serves many streams at once, but the session's commands still share one sandbox.

Commands run with the environment and working directory the engine gives
(``Sandbox.exec_environment``: those of the sandbox's own processes, with ``DISPLAY``).
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping

from ..errors import DeskboxError, InvalidRequest, NotFound, Timeout
from ..sandbox_io import ExecCommand, ExecResult, FileDownload, FileTooLarge, check_sandbox_path
from ..settings import AGENT_MAX_EXEC_OUTPUT, AGENT_MAX_EXEC_TIMEOUT_S
from .client import AgentClient, ExecChunk, FileReader
from .exec_slots import ExecSlots

__all__ = ["DETACH", "AgentDownload", "AgentSandboxIO"]

_START_TIMEOUT_S = 30.0
# An upload's whole time: the caller's body may come slowly; an agent that stops reading
# fails at once anyway (the client's write timeout).
_UPLOAD_TIMEOUT_S = 3600.0
_BACKGROUND_STATUS = re.compile(r"^(PID|ERR) ([0-9]{1,9})\n$")
_AGENT_ERROR = re.compile(r"^agent: ([a-z_]{1,32}): (.*)$", re.S)

# Forks the command into a session of its own and reports its pid: a program of the image
# (desktop_image/rootfs/usr/local/bin/deskbox-detach).
DETACH = "/usr/local/bin/deskbox-detach"


def _agent_error(error: DeskboxError) -> tuple[str, str]:
    """The agent's error kind and message, as the client reported them ("" if not one)."""
    match = _AGENT_ERROR.match(error.message)
    return (match[1], match[2]) if match else ("", error.message)


def _file_error(path: str, error: DeskboxError, writing: bool) -> DeskboxError:
    """The API's error for the agent's refusal of a file call (messages name the path)."""
    kind, message = _agent_error(error)
    verb = "write" if writing else "read"
    if kind == "not_found":
        where = "its directory does not exist" if writing else "no such file"
        return NotFound(f"{path}: {message} ({where} in the sandbox)")
    if kind in ("too_large", "no_space"):
        return FileTooLarge(f"cannot {verb} {path}: {message}")
    if kind == "not_a_file":
        return InvalidRequest(message)  # names the path: "... is a directory"
    if kind:  # forbidden, os_error, bad_request: the same error, naming the path
        return type(error)(f"cannot {verb} {path}: {message}")
    return error


class AgentDownload(FileDownload):
    """A file streamed from the agent; closing it ends the stream and calls ``release``."""

    def __init__(self, reader: FileReader, release: Callable[[], None]) -> None:
        self.size = reader.size
        self._reader = reader
        self._release: Callable[[], None] | None = release

    def chunks(self) -> AsyncIterator[bytes]:
        return self._reader.chunks()

    async def aclose(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            self._reader.close()
            release()


class AgentSandboxIO:
    """Commands and files of one sandbox through its agent's ``client``; each call takes
    one of ``slots`` while it runs."""

    def __init__(
        self, client: AgentClient, env: Mapping[str, str], cwd: str, slots: ExecSlots
    ) -> None:
        self.client = client
        self.env = dict(env)
        self.cwd = cwd
        self.slots = slots

    async def run(self, command: ExecCommand) -> ExecResult:
        """Run ``command`` to its end (or its timeout), or start it in the background."""
        slot = self.slots.take()
        try:
            if command.background:
                return await self._background(command)
            return await self._run(command)
        finally:
            slot.release()

    async def _run(self, command: ExecCommand) -> ExecResult:
        started = time.monotonic()
        limit = min(command.output_limit, AGENT_MAX_EXEC_OUTPUT)
        out, err = bytearray(), bytearray()
        env = {**self.env, **command.env}
        try:
            async for item in self.client.exec(
                command.argv, env=env, cwd=self.cwd,
                timeout_s=min(command.timeout_s, AGENT_MAX_EXEC_TIMEOUT_S), max_output=limit,
            ):
                if isinstance(item, ExecChunk):
                    (out if item.stream == "stdout" else err).extend(item.data)
                    continue
                exit_code = item.exit_code
                if item.timed_out:
                    exit_code = None
                elif item.signal is not None:
                    exit_code = 128 + item.signal
                return ExecResult(
                    exit_code=exit_code, stdout=bytes(out), stderr=bytes(err),
                    stdout_truncated=item.stdout_truncated,
                    stderr_truncated=item.stderr_truncated,
                    timed_out=item.timed_out, duration_s=time.monotonic() - started,
                )
        except InvalidRequest as error:
            kind, message = _agent_error(error)
            if kind != "exec_failed":
                raise
            missing = "No such file" in message or "not found" in message
            stderr = f"deskbox: {message}\n".encode()[:command.output_limit]
            return ExecResult(exit_code=127 if missing else 126, stderr=stderr,
                              duration_s=time.monotonic() - started)
        raise AssertionError("the client's exec ends with a status")  # pragma: no cover

    async def _background(self, command: ExecCommand) -> ExecResult:
        """Start the command through DETACH, which forks it into a session of its own and
        exits: the command then belongs to the sandbox's init, not the agent."""
        started = time.monotonic()
        launcher = ExecCommand(
            argv=(DETACH, *command.argv),
            env=command.env, timeout_s=_START_TIMEOUT_S, output_limit=64,
        )
        result = await self._run(launcher)
        elapsed = time.monotonic() - started
        if result.timed_out:
            raise Timeout("the sandbox did not start the command in time")
        status = _BACKGROUND_STATUS.match(result.stdout.decode(errors="replace"))
        if status is not None and status[1] == "PID":
            return ExecResult(exit_code=None, pid=int(status[2]), duration_s=elapsed)
        if status is not None:
            number = int(status[2])
            reason = os.strerror(number) if 0 < number < 4096 else f"error {number}"
            return ExecResult(
                exit_code=127 if number == errno.ENOENT else 126, duration_s=elapsed,
                stderr=f"deskbox: cannot run {command.argv[0]!r}: {reason}\n".encode(),
            )
        return ExecResult(exit_code=126, duration_s=elapsed,
                          stderr=result.stderr or b"the sandbox could not start the command\n")

    async def read_file(self, path: str, limit: int) -> FileDownload:
        check_sandbox_path(path)
        slot = self.slots.take()
        try:
            try:
                reader = await self.client.open_file(path, limit)
            except DeskboxError as error:
                raise _file_error(path, error, writing=False) from None
        except BaseException:
            slot.release()
            raise
        return AgentDownload(reader, slot.release)

    async def write_file(self, path: str, chunks: AsyncIterable[bytes], limit: int) -> int:
        check_sandbox_path(path)
        slot = self.slots.take()
        try:
            total = 0

            async def capped() -> AsyncIterator[bytes]:
                nonlocal total
                async for chunk in chunks:
                    total += len(chunk)
                    if total > limit:
                        raise FileTooLarge(
                            f"the upload is larger than this server's limit of {limit} bytes")
                    yield chunk

            try:
                return await self.client.write_file(path, capped(), mode=None, max_bytes=limit,
                                                    timeout_s=_UPLOAD_TIMEOUT_S)
            except FileTooLarge:
                raise
            except DeskboxError as error:
                raise _file_error(path, error, writing=True) from None
        finally:
            slot.release()

