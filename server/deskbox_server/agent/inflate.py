"""Inflating what an agent deflated: bounded by the size it must have, and in one call that
lets go of the GIL.

A paused session's last frame comes deflated (desktop_image/agent/PROTOCOL.md,
``grab_deflated``) and is inflated on a worker thread while the sandbox freezes. A
streaming inflater (isal_zlib's, zlib's) grows its output from 32 KiB and takes the GIL
back at every step; beside a busy event loop each step waits out Python's switch interval
(5 ms), and a 4 MB frame took 45 ms instead of 2. libdeflate inflates into a buffer of
exactly the expected size in one call, which ctypes makes without the GIL: it cannot make
more than that, and it checks the stream's Adler-32 (1.2 ms for a page of text's 4 MB where
isal_zlib takes 1.8). Where libdeflate is missing (Debian's ``libdeflate0``, which
scripts/setup.sh installs), isal_zlib's streaming inflater does the same checks.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import cast

from isal import isal_zlib

__all__ = ["inflate_exact", "inflate_streaming", "libdeflate"]

log = logging.getLogger("deskbox.agent")

_LIBRARY = "libdeflate.so.0"
_SUCCESS = 0  # enum libdeflate_result
_ISAL_ERROR = cast(type[Exception], isal_zlib.IsalError)


@functools.cache
def libdeflate() -> ctypes.CDLL | None:
    """The library with the three functions used here typed; None if it is missing."""
    try:
        library = ctypes.CDLL(_LIBRARY)
    except OSError as error:
        log.warning("%s is missing (%s): paused frames are inflated by isal_zlib instead, "
                    "slower beside a busy server", _LIBRARY, error)
        return None
    library.libdeflate_alloc_decompressor.argtypes = []
    library.libdeflate_alloc_decompressor.restype = ctypes.c_void_p
    library.libdeflate_free_decompressor.argtypes = [ctypes.c_void_p]
    library.libdeflate_free_decompressor.restype = None
    size_p = ctypes.POINTER(ctypes.c_size_t)
    library.libdeflate_zlib_decompress_ex.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
        size_p, size_p]
    library.libdeflate_zlib_decompress_ex.restype = ctypes.c_int
    return library


def inflate_exact(data: bytes, size: int) -> bytes | bytearray | None:
    """``data`` inflated if it is one whole zlib stream (its Adler-32 right) of exactly
    ``size`` bytes with nothing after it; None if not. Never makes more than ``size + 1``
    bytes of it."""
    library = libdeflate()
    if library is None or size < 1:
        return inflate_streaming(data, size)
    decompressor = library.libdeflate_alloc_decompressor()
    if not decompressor:
        raise MemoryError("libdeflate could not allocate a decompressor")
    out = bytearray(size)
    target = (ctypes.c_char * size).from_buffer(out)
    used, made = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        result = library.libdeflate_zlib_decompress_ex(
            decompressor, data, len(data), ctypes.addressof(target), size,
            ctypes.byref(used), ctypes.byref(made))
    finally:
        library.libdeflate_free_decompressor(decompressor)
        del target  # the buffer is exported while a ctypes view of it lives
    if result != _SUCCESS or used.value != len(data) or made.value != size:
        return None
    return out


def inflate_streaming(data: bytes, size: int) -> bytes | None:
    """:func:`inflate_exact` with isal_zlib's streaming inflater (the GIL taken back at
    each step of its output's growth)."""
    inflater = isal_zlib.decompressobj()
    try:
        out = inflater.decompress(data, size + 1)
    except _ISAL_ERROR:
        return None
    if len(out) != size or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        return None
    return out
