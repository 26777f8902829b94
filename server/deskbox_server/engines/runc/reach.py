"""Whether a sandbox can reach the session image by its host path.

runc's init mounts the image's root filesystem by its path from inside the sandbox's user
namespace (egress ``none``, the default: layout.py), as a host uid and gid that own no
host directory. So every directory on the way must let other users pass (``o+x``); a
home directory (``/root`` is 0700) does not, and every session would then fail at its
start with runc's "permission denied". The engine checks once, before serving.
"""

from __future__ import annotations

import stat
from pathlib import Path

from ...errors import Internal

__all__ = ["check_image_reachable", "closed_directory"]


def closed_directory(path: Path) -> Path | None:
    """The first directory from ``/`` down to ``path`` (itself included, links followed)
    that other users cannot pass through; None if there is none."""
    real = path.resolve(strict=True)
    for directory in (*reversed(real.parents), real):
        if not directory.stat().st_mode & stat.S_IXOTH:
            return directory
    return None


def check_image_reachable(rootfs: Path) -> None:
    """Internal, saying what to change, if sandboxes could not mount ``rootfs``."""
    try:
        closed = closed_directory(rootfs)
    except OSError as error:
        raise Internal(f"the session image at {rootfs} cannot be found: {error}") from None
    if closed is None:
        return
    mode = stat.S_IMODE(closed.stat().st_mode)
    raise Internal(
        f"sandboxes cannot reach the session image at {rootfs}: {closed} (mode {mode:04o}) "
        "lets no other user pass, and a sandbox's root is an unprivileged user of the host. "
        "Set DESKBOX_IMAGE_STATE_DIR to a directory every user may pass through (as root "
        f"the default is /var/cache/deskbox), or run: chmod o+x {closed}"
    )
