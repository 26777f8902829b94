"""A checkpoint's images packed into one file, and unpacked again (hibernate, snapshots).

The file is a zstd stream of tar archives: a skippable frame first (our tag and the length
of each part), then two parts, each a tar of about half the images' bytes compressed on its
own. zstd skips the skippable frame, so ``zstd -d`` makes the whole file into the parts'
tars one after the other (``tar --ignore-zeros`` reads them all). A restore runs one
``tar -x`` per part at once: writing ~170 MB of images into the scratch directory was one
tar's thread, ~0.2 s of system time, and two share it (a 169 MB checkpoint unpacks in
205 ms instead of 240 on 2 cores; bench/README.md). A file that does not start with the
frame (packed before the parts) is unpacked whole, as before.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
from pathlib import Path

from ...errors import DeskboxError, InsufficientStorage, SessionFailed, says_no_room

__all__ = ["PARTS", "pack", "unpack"]

PARTS = 2
# A zstd skippable frame (RFC 8878 3.1.2): magic 0x184D2A50-5F, payload size, payload.
_SKIPPABLE = 0x184D2A5D
_TAG = b"deskbox-checkpoint-parts-1\0"
_FRAME = struct.Struct("<II")
_LENGTHS = struct.Struct(f"<{PARTS}Q")
_HEADER_SIZE = _FRAME.size + len(_TAG) + _LENGTHS.size
_TIMEOUT_S = 300
_CHUNK = 1 << 20


def _parts(images: Path) -> list[list[str]]:
    """The images' relative paths in ``PARTS`` lists of about equal bytes (largest first,
    each to the lightest list)."""
    files = sorted(((path.stat().st_size, str(path.relative_to(images)))
                    for path in images.rglob("*") if path.is_file() and not path.is_symlink()),
                   reverse=True)
    lists: list[list[str]] = [[] for _ in range(PARTS)]
    sizes = [0] * PARTS
    for size, name in files:
        lightest = sizes.index(min(sizes))
        lists[lightest].append(name)
        sizes[lightest] += size
    return lists


def _failure(what: str, stderr: bytes, where: Path) -> DeskboxError:
    detail = stderr[-2000:].decode(errors="replace").strip()
    if says_no_room(detail):
        return InsufficientStorage(
            f"no room on the server's disk for the checkpoint ({where}): {detail}")
    return SessionFailed(f"{what}: {detail}")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """Kill what still runs (another part failed) and close every pipe to them."""
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def pack(images: Path, archive: Path) -> int:
    """Compress ``images`` into ``archive`` (mode 0600, replaced atomically); its size.
    Only regular files are packed (CRIU's images are nothing else)."""
    try:
        return _pack(images, archive)
    except subprocess.TimeoutExpired:
        raise SessionFailed(f"compressing the checkpoint took over {_TIMEOUT_S:.0f} s") from None


def _pack(images: Path, archive: Path) -> int:
    partial = archive.with_suffix(".partial")
    part_files = [archive.with_suffix(f".part{index}") for index in range(PARTS)]
    running: list[subprocess.Popen[bytes]] = []
    try:
        lists = _parts(images)
        for part in part_files:  # both parts compress at once
            # The session's memory: mode 0600 before a byte is in it (tar keeps the mode).
            os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
            running.append(subprocess.Popen(
                ["tar", "-C", str(images), "--null", "--verbatim-files-from", "-T", "-",
                 "-I", "zstd -1 -T0 -q", "-cf", str(part)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        for process, names in zip(running, lists, strict=True):
            _, stderr = process.communicate(
                b"".join(name.encode() + b"\0" for name in names), timeout=_TIMEOUT_S)
            if process.returncode != 0:
                raise _failure("could not compress the checkpoint", stderr, archive.parent)
        lengths = [part.stat().st_size for part in part_files]
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(_FRAME.pack(_SKIPPABLE, _HEADER_SIZE - _FRAME.size) + _TAG
                      + _LENGTHS.pack(*lengths))
            out.flush()
            for part, length in zip(part_files, lengths, strict=True):
                with part.open("rb") as source:
                    while length > 0:  # in the kernel, no copy through here
                        copied = os.copy_file_range(source.fileno(), out.fileno(), length)
                        if copied == 0:
                            raise SessionFailed(f"{part} ended early while it was packed")
                        length -= copied
        os.chmod(partial, 0o600)
        os.replace(partial, archive)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        _stop(running)
        for part in part_files:
            part.unlink(missing_ok=True)
    return archive.stat().st_size


def _lengths(archive: Path) -> list[int] | None:
    """The parts' lengths from the archive's header; None for an archive of one part."""
    with archive.open("rb") as file:
        head = file.read(_HEADER_SIZE)
    if len(head) < _HEADER_SIZE or head[_FRAME.size:_FRAME.size + len(_TAG)] != _TAG:
        return None
    magic, size = _FRAME.unpack_from(head)
    if magic != _SKIPPABLE or size != _HEADER_SIZE - _FRAME.size:
        return None
    return list(_LENGTHS.unpack_from(head, _FRAME.size + len(_TAG)))


def _feed(archive: Path, offset: int, length: int, pipe: int) -> None:
    """Copy ``length`` bytes of ``archive`` from ``offset`` into ``pipe``, then close it."""
    try:
        with archive.open("rb") as file:
            while length > 0:
                sent = os.sendfile(pipe, file.fileno(), offset, min(_CHUNK, length))
                if sent == 0:
                    return
                offset += sent
                length -= sent
    except BrokenPipeError:
        pass  # tar stopped early: its exit status says why
    finally:
        os.close(pipe)


def unpack(archive: Path, images: Path) -> None:
    """Unpack ``archive`` into ``images``; SessionFailed if it is missing or corrupted."""
    try:
        _unpack(archive, images)
    except subprocess.TimeoutExpired:
        raise SessionFailed(f"unpacking the checkpoint took over {_TIMEOUT_S:.0f} s") from None


def _unpack(archive: Path, images: Path) -> None:
    if not archive.is_file():
        raise SessionFailed(f"the checkpoint {archive} is missing")
    lengths = _lengths(archive)
    if lengths is None:
        unpacked = subprocess.run(
            ["tar", "-C", str(images), "-I", "zstd -q", "-xf", str(archive)],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=_TIMEOUT_S, check=False)
        if unpacked.returncode != 0:
            raise _failure("the checkpoint is corrupted", unpacked.stderr, images)
    else:
        size = archive.stat().st_size
        if _HEADER_SIZE + sum(lengths) != size:
            raise SessionFailed(f"the checkpoint is corrupted: {size} bytes where its header "
                                f"says {_HEADER_SIZE + sum(lengths)}")
        _unpack_parts(archive, lengths, images)
    if not (images / "inventory.img").is_file():
        raise SessionFailed("the checkpoint is corrupted: it holds no CRIU inventory")


def _unpack_parts(archive: Path, lengths: list[int], images: Path) -> None:
    """One ``tar -x`` per part, all at once, each fed its bytes of the archive by a thread."""
    running: list[subprocess.Popen[bytes]] = []
    feeders: list[threading.Thread] = []
    offset = _HEADER_SIZE
    try:
        for length in lengths:
            read_end, write_end = os.pipe()
            try:
                running.append(subprocess.Popen(
                    ["tar", "-C", str(images), "-I", "zstd -q", "-xf", "-"],
                    stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            except BaseException:
                os.close(write_end)
                raise
            finally:
                os.close(read_end)
            feeder = threading.Thread(target=_feed, args=(archive, offset, length, write_end),
                                      name="deskbox-unpack", daemon=True)
            feeder.start()
            feeders.append(feeder)
            offset += length
        failures = []
        for process in running:
            _, stderr = process.communicate(timeout=_TIMEOUT_S)
            if process.returncode != 0:
                failures.append(stderr)
        if failures:
            raise _failure("the checkpoint is corrupted", failures[0], images)
    finally:
        _stop(running)
        for feeder in feeders:
            feeder.join()
