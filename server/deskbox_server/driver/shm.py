"""MIT-SHM capture with a sealed buffer, safe against a hostile X server.

mss shares a memfd with the X server and maps it on our side. An X server in a sandbox
could keep that fd and shrink the file, and our next read of the mapping would die with
SIGBUS — taking the control plane down. Sealing the memfd against shrinking and growing
before it is handed over makes that impossible; everything else is mss's own path, over
a relayed connection (``xcb_relayed``).
"""

from __future__ import annotations

import fcntl
import os
from mmap import PROT_READ, mmap

from mss.linux import xcb, xcbgen
from mss.linux.xcbhelpers import LIB, XError
from mss.linux.xshmgetimage import MSSImplXShmGetImage, ShmStatus

from .xcb_relayed import RelayedXcb

__all__ = ["SEALS", "SealedShmCapture"]

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
MEMFD_NAME = "deskbox-capture"


class SealedShmCapture(MSSImplXShmGetImage, RelayedXcb):
    """mss's XShmGetImage backend whose shared buffer has a fixed, sealed size."""

    def __init__(self, display_name: str, width: int, height: int) -> None:
        self._init_relayed(display_name, width, height, super().__init__)

    def _setup_shm(self) -> ShmStatus:
        assert self.conn is not None
        try:
            if not xcb.get_extension_data(self.conn, LIB.shm_id).present:
                self._shm_report_issue("MIT-SHM extension not present")
                return ShmStatus.UNAVAILABLE
            version = xcbgen.shm_query_version(self.conn)
            if (version.major_version, version.minor_version) < (1, 2):
                self._shm_report_issue("MIT-SHM too old for fd passing")
                return ShmStatus.UNAVAILABLE
            screen = self.pref_screen
            self._bufsize = screen.width_in_pixels * screen.height_in_pixels * 4
            fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            self._memfd = fd
            os.ftruncate(fd, self._bufsize)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            self._buf = mmap(fd, self._bufsize, prot=PROT_READ)
            self._shmseg = xcbgen.ShmSeg(xcb.generate_id(self.conn).value)
            try:
                try:
                    # XCB closes the fd whether the attach works or not.
                    xcbgen.shm_attach_fd(self.conn, self._shmseg, fd, read_only=False)
                finally:
                    self._memfd = None
            except XError as error:
                return self._shm_unavailable("cannot attach the MIT-SHM segment", error)
        except Exception:
            self._shutdown_shm()
            raise
        return ShmStatus.UNKNOWN
