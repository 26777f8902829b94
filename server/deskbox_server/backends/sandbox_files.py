"""Files in and out of a runc sandbox, by a small program that runs *inside* it.

The host never opens a path of the sandbox: the image's ``python3`` (read-only root, run
with ``-I -S``: no site, no user paths, no environment) opens it in the sandbox's own mount
namespace, through ``runc exec`` like any command (sandbox_exec.py). ``..``, symlinks to
``/proc/1/root`` or to host paths all resolve in there, by construction.

What the program sends back is hostile input: a one-line status of bounded length parsed
by a strict pattern (only an errno number crosses, the message is made here), then at most
the bytes the caller's limit allows.

Read: ``OK <size>\\n`` then the bytes, or ``ERR <errno>\\n`` / ``BIG <size>\\n`` /
``NOTREG\\n``. Write: ``READY\\n`` once a temporary file next to the (symlink-resolved)
target exists, then the host sends frames (4-byte big-endian length, bytes; length 0
commits); the program renames the file into place and answers ``OK <size>\\n``. Without the
commit frame (upload aborted, over its cap) it removes the temporary file: a failed upload
leaves the old file as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import struct
from collections.abc import AsyncIterable, AsyncIterator

from ..errors import DeskboxError, Forbidden, InvalidRequest, NotFound, Timeout
from ..sandbox_io import FileDownload, check_sandbox_path
from .pipes import PipeReader, PipeWriter, pipe
from .sandbox_exec import PYTHON, Launch, SandboxExec

__all__ = ["FileTooLarge", "RuncDownload", "read_file", "write_file"]

FRAME = 1 << 20
_STATUS_LIMIT = 64
_HANDSHAKE_TIMEOUT_S = 30.0
_STATUS = re.compile(rb"^(?:(OK|ERR|BIG) ([0-9]{1,19})|(NOTREG|READY))$")

READ_PROGRAM = r"""
import errno, os, stat, sys
def out(b):
    while b:
        b = b[os.write(1, b):]
path, limit = sys.argv[1], int(sys.argv[2])
try:
    fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
except OSError as e:
    out(b"ERR %d\n" % (e.errno or errno.EIO)); sys.exit(0)
if stat.S_ISDIR(st.st_mode):
    out(b"ERR %d\n" % errno.EISDIR); sys.exit(0)
if not stat.S_ISREG(st.st_mode):
    out(b"NOTREG\n"); sys.exit(0)
if st.st_size > limit:
    out(b"BIG %d\n" % st.st_size); sys.exit(0)
os.set_blocking(fd, True)
out(b"OK %d\n" % st.st_size)
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    out(b)
"""

WRITE_PROGRAM = r"""
import errno, os, stat, struct, sys
def out(b):
    while b:
        b = b[os.write(1, b):]
def fail(code):
    out(b"ERR %d\n" % (code or errno.EIO)); sys.exit(0)
def read_exactly(n):
    parts = []
    while n:
        b = os.read(0, min(n, 1 << 20))
        if not b:
            return None
        parts.append(b)
        n -= len(b)
    return b"".join(parts)
path = sys.argv[1]
try:
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        fail(errno.EISDIR)
    if st is not None and not stat.S_ISREG(st.st_mode):
        out(b"NOTREG\n"); sys.exit(0)
    tmp = os.path.join(os.path.dirname(real), ".deskbox-upload-%d" % os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
except OSError as e:
    fail(e.errno)
out(b"READY\n")
total = 0
try:
    while True:
        head = read_exactly(4)
        if head is None:
            os.unlink(tmp); sys.exit(1)
        n = struct.unpack(">I", head)[0]
        if n == 0:
            break
        data = read_exactly(n)
        if data is None:
            os.unlink(tmp); sys.exit(1)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        total += n
    os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else 0o644)
    os.close(fd)
    os.replace(tmp, real)
except OSError as e:
    try:
        os.unlink(tmp)
    except OSError:
        pass
    fail(e.errno)
out(b"OK %d\n" % total)
"""


class FileTooLarge(InvalidRequest):
    """Over the server's file size cap (or the sandbox's free space): 413."""

    status = 413


def _os_error(path: str, code: int, writing: bool) -> DeskboxError:
    """The API error for an errno the program reported (the message is ours, not its)."""
    reason = os.strerror(code) if 0 < code < 4096 else f"error {code}"
    what = f"{path}: {reason}"
    if code == errno.ENOENT:
        if writing:
            return NotFound(f"{what} (its directory does not exist in the sandbox)")
        return NotFound(f"{what} (no such file in the sandbox)")
    if code == errno.EISDIR:
        return InvalidRequest(f"{path} is a directory")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return Forbidden(f"cannot write {what}" if writing else f"cannot read {what}")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return FileTooLarge(f"cannot write {what}")
    return InvalidRequest(f"cannot {'write' if writing else 'read'} {what}")


async def _status_line(reader: PipeReader, timeout_s: float) -> tuple[bytes, bytes]:
    """The program's status line and whatever came after it in the same reads."""
    buffer = b""

    async def until_newline() -> None:
        nonlocal buffer
        while b"\n" not in buffer:
            chunk = await reader.read(_STATUS_LIMIT)
            if not chunk:
                return
            buffer += chunk
            if len(buffer) > _STATUS_LIMIT and b"\n" not in buffer[:_STATUS_LIMIT]:
                return

    try:
        await asyncio.wait_for(until_newline(), timeout_s)
    except TimeoutError:
        raise Timeout("the sandbox did not answer a file request in time") from None
    line, newline, rest = buffer.partition(b"\n")
    if not newline or len(line) > _STATUS_LIMIT:
        return b"", b""
    return line, rest


def _parse(line: bytes) -> tuple[str, int]:
    match = _STATUS.match(line)
    if match is None:
        return "", 0
    if match[3]:
        return match[3].decode(), 0
    return match[1].decode(), int(match[2])


class RuncDownload(FileDownload):
    def __init__(
        self, launch: Launch, reader: PipeReader, size: int, first: bytes, limit: int
    ) -> None:
        self.size = size
        self._launch = launch
        self._reader = reader
        self._first = first
        self._limit = size if size > 0 else limit
        self._closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        sent = 0
        pending, self._first = self._first, b""
        while True:
            if not pending:
                pending = await self._reader.read(FRAME)
                if not pending:
                    break
            room = self._limit - sent
            if len(pending) > room:
                if room > 0:
                    sent += room
                    yield pending[:room]
                if self.size > 0:
                    return  # the file grew since it was opened: its size then is served
                raise FileTooLarge(f"the file is larger than {self._limit} bytes")
            sent += len(pending)
            yield pending
            pending = b""
            if self.size > 0 and sent == self.size:
                return
        if self.size > 0 and sent != self.size:
            raise OSError(f"the sandbox sent {sent} of the file's {self.size} bytes")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader.close()
        await self._launch.kill()
        self._launch.cleanup()


async def read_file(runner: SandboxExec, path: str, limit: int) -> RuncDownload:
    """Open ``path`` inside the sandbox; errors (404, 422, 413, 403) before any byte."""
    check_sandbox_path(path)
    out_read, out_write = pipe()
    reader = PipeReader(out_read)
    try:
        launch = await runner.launch(
            [PYTHON, "-I", "-S", "-c", READ_PROGRAM, path, str(limit)], {}, cwd="/",
            stdout=out_write,
        )
    except BaseException:
        reader.close()
        raise
    finally:
        os.close(out_write)
    download = RuncDownload(launch, reader, 0, b"", limit)
    try:
        line, rest = await _status_line(reader, _HANDSHAKE_TIMEOUT_S)
        kind, number = _parse(line)
        if kind == "OK" and number <= limit:
            download = RuncDownload(launch, reader, number, rest, limit)
            return download
        if kind == "ERR":
            raise _os_error(path, number, writing=False)
        if kind == "BIG" or kind == "OK":
            raise FileTooLarge(f"{path} has {number} bytes: more than this server's limit "
                               f"of {limit} bytes")
        if kind == "NOTREG":
            raise InvalidRequest(f"{path} is not a regular file")
        await launch.kill()
        if not launch.started():
            runner.failed_start(launch)
        raise InvalidRequest(f"the sandbox could not read {path}")
    except BaseException:
        await download.aclose()
        raise


async def write_file(
    runner: SandboxExec, path: str, chunks: AsyncIterable[bytes], limit: int
) -> int:
    """Write the bytes of ``chunks`` to ``path`` inside the sandbox; returns their count.

    Over ``limit`` bytes the upload stops with FileTooLarge and the file is left as it was.
    """
    check_sandbox_path(path)
    in_read, in_write = pipe()
    out_read, out_write = pipe()
    writer, reader = PipeWriter(in_write), PipeReader(out_read)
    try:
        launch = await runner.launch(
            [PYTHON, "-I", "-S", "-c", WRITE_PROGRAM, path], {}, cwd="/",
            stdin=in_read, stdout=out_write,
        )
    except BaseException:
        writer.close()
        reader.close()
        raise
    finally:
        os.close(in_read)
        os.close(out_write)
    try:
        line, _ = await _status_line(reader, _HANDSHAKE_TIMEOUT_S)
        kind, number = _parse(line)
        if kind == "ERR":
            raise _os_error(path, number, writing=True)
        if kind == "NOTREG":
            raise InvalidRequest(f"{path} exists and is not a regular file")
        if kind != "READY":
            await launch.kill()
            if not launch.started():
                runner.failed_start(launch)
            raise InvalidRequest(f"the sandbox could not write {path}")
        total = 0
        try:
            async for chunk in chunks:
                total += len(chunk)
                if total > limit:
                    raise FileTooLarge(
                        f"the upload is larger than this server's limit of {limit} bytes"
                    )
                for start in range(0, len(chunk), FRAME):
                    piece = chunk[start:start + FRAME]
                    await writer.write(struct.pack(">I", len(piece)) + piece)
            await writer.write(struct.pack(">I", 0))
        except BrokenPipeError:
            pass  # the program stopped reading: its status line says why
        writer.close()
        line, _ = await _status_line(reader, _HANDSHAKE_TIMEOUT_S)
        kind, number = _parse(line)
        if kind == "ERR":
            raise _os_error(path, number, writing=True)
        if kind != "OK" or number != total:
            raise InvalidRequest(f"the sandbox did not complete writing {path}")
        return total
    finally:
        # Without the commit frame the program removes its temporary file, then exits.
        writer.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(launch.wait(), _HANDSHAKE_TIMEOUT_S)
        reader.close()
        await launch.kill()
        launch.cleanup()
