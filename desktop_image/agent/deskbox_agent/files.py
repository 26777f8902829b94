"""``GET`` and ``PUT /v1/files?path=``: file transfer, streamed both ways, with size caps.

Paths are the sandbox's own: the agent runs inside it, so ``..`` and symlinks resolve
there by construction. A write goes to a temporary file next to the target and is renamed
into place only when the whole body arrived: an aborted or oversized upload leaves the old
file as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import secrets
import stat

from .h2server import Stream
from .limits import Limits

__all__ = ["get_file", "put_file"]

CHUNK = 256 * 1024
# A file that says it has at most CHUNK bytes is read whole first and sent with the length
# read: /proc's files say 0 and sysfs's say 4096 (a page) whatever they hold, and a
# content-length they do not fill would cut the download. Such a file that then turns out
# to be larger is read up to UNSIZED_MAX.
UNSIZED_MAX = 16 * 1024 * 1024


def _errno_reply(e: OSError) -> tuple[int, str, str]:
    name = errno.errorcode.get(e.errno or 0, "EIO")
    status = {errno.ENOENT: 404, errno.ENOTDIR: 404, errno.EACCES: 403, errno.EPERM: 403,
              errno.EROFS: 403, errno.ENOSPC: 507, errno.EDQUOT: 507}.get(e.errno or 0, 422)
    kind = {404: "not_found", 403: "forbidden", 507: "no_space"}.get(status, "os_error")
    return status, kind, f"{name}: {e.strerror}"


def _path(stream: Stream) -> str | None:
    path = stream.query.get("path", "")
    if not path.startswith("/") or "\x00" in path or len(path) > 4096:
        return None
    return path


def _cap(stream: Stream, limits: Limits) -> int | None:
    raw = stream.query.get("max", str(limits.max_file_size))
    if not (raw.isascii() and raw.isdigit()) or int(raw) > limits.max_file_size:
        return None
    return int(raw)


async def get_file(stream: Stream, limits: Limits) -> None:
    path, cap = _path(stream), _cap(stream, limits)
    if path is None or cap is None:
        await stream.error(400, "bad_request", "need an absolute path= and max= within limits")
        return
    try:
        fd, st = await _open_to_read(path)
    except OSError as e:
        await stream.error(*_errno_reply(e))
        return
    try:
        if stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(st.st_mode):
            await stream.error(422, "not_a_file", f"{path} is not a regular file")
            return
        if st.st_size > cap:
            await stream.error(413, "too_large", f"{path} has {st.st_size} bytes, over {cap}")
            return
        os.set_blocking(fd, True)
        if st.st_size <= CHUNK:
            await _send_whole(stream, fd, path, min(cap, UNSIZED_MAX))
            return
        await stream.respond(200, "application/octet-stream",
                             extra={"content-length": str(st.st_size)})
        left = st.st_size  # a file that grows meanwhile is cut at its size when opened
        while left:
            try:
                chunk = await asyncio.to_thread(os.read, fd, min(CHUNK, left))
            except OSError:
                chunk = b""
            if not chunk:
                # It shrank (a log rotated) or could not be read on: fewer bytes than the
                # content-length sent would break the connection's framing (HTTP/2 checks
                # it), so only this stream is reset, and the host's download ends cut.
                stream.abort()
                return
            left -= len(chunk)
            await stream.write(chunk)
        await stream.write(b"", end=True)
    finally:
        os.close(fd)


def _open_and_stat(path: str) -> tuple[int, os.stat_result]:
    # Non-blocking: opening a FIFO for reading must not wait for a writer.
    fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


async def _open_to_read(path: str) -> tuple[int, os.stat_result]:
    """Open and stat off the loop (a volume's disk may be slow): a click must not wait
    for it. If the transfer is cancelled meanwhile, the thread's descriptor is closed."""
    opening = asyncio.ensure_future(asyncio.to_thread(_open_and_stat, path))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[tuple[int, os.stat_result]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result()[0])


def _resolve(path: str) -> tuple[str, os.stat_result | None]:
    """The real path a write lands on, and what is there now (None: nothing yet, or an
    error that creating it will report)."""
    target = os.path.realpath(path)
    try:
        return target, os.stat(target)
    except OSError:
        return target, None


async def _send_whole(stream: Stream, fd: int, path: str, cap: int) -> None:
    """A small file, or one whose size may be wrong (/proc, sysfs): read whole (at most
    ``cap`` bytes, else 413), then sent with the length read."""
    data = bytearray()
    while len(data) <= cap:
        try:
            chunk = await asyncio.to_thread(os.read, fd, min(CHUNK, cap + 1 - len(data)))
        except OSError as e:  # /proc/self/mem, many sysfs files: EIO, EINVAL
            await stream.error(*_errno_reply(e))
            return
        if not chunk:
            break
        data += chunk
    if len(data) > cap:
        await stream.error(413, "too_large", f"{path} has more than {cap} bytes")
        return
    await stream.respond(200, "application/octet-stream",
                         extra={"content-length": str(len(data))})
    await stream.write(bytes(data), end=True)


async def put_file(stream: Stream, limits: Limits) -> None:
    path, cap = _path(stream), _cap(stream, limits)
    mode_raw = stream.query.get("mode", "")
    if path is None or cap is None or not (
        len(mode_raw) <= 4 and all(c in "01234567" for c in mode_raw)
    ):
        await stream.error(400, "bad_request", "need an absolute path=, max= and octal mode=")
        return
    target, existing = await asyncio.to_thread(_resolve, path)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        what = "a directory" if stat.S_ISDIR(existing.st_mode) else "not a regular file"
        await stream.error(422, "not_a_file", f"{path} is {what}")
        return
    if not mode_raw:  # a replaced file keeps its mode, a new one gets 644
        mode_raw = f"{stat.S_IMODE(existing.st_mode):o}" if existing is not None else "644"
    temp = os.path.join(os.path.dirname(target), f".deskbox-upload-{secrets.token_hex(6)}")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                     int(mode_raw, 8))
    except OSError as e:
        await stream.error(*_errno_reply(e))
        return
    size, done = 0, False
    try:
        while chunk := await stream.read(CHUNK):
            size += len(chunk)
            if size > cap:
                await stream.error(413, "too_large", f"the upload exceeds {cap} bytes")
                return
            await asyncio.to_thread(_write_all, fd, chunk)
        os.fchmod(fd, int(mode_raw, 8))
        os.close(fd)
        fd = -1
        os.rename(temp, target)
        done = True
    except OSError as e:
        await stream.error(*_errno_reply(e))
        return
    finally:
        if fd >= 0:
            os.close(fd)
        if not done:
            with contextlib.suppress(OSError):
                os.unlink(temp)
    await stream.json(200, {"size": size})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
