"""Repairs the mounts of a restored sandbox from inside its mount namespace (restored.py).

Run as its own process by the host's Python (``python3 -I -S mount_repair.py PID JSON``):
setns(CLONE_NEWNS) is refused to a multi-threaded process such as the server, and nothing
of the sandbox may run with the host's privileges, so this script enters the namespace
itself and then makes only system calls. It imports nothing but the standard library.

JSON is a list of ``[kind, path, flags]`` (mounts.Repair): ``readonly-root`` remounts
``path`` read-only keeping ``flags`` (in a user namespace they are locked, and a remount
that clears one is refused even to the host's root); ``mask`` puts the sandbox's own
``/dev/null`` over ``path``. Exits non-zero naming the call that failed.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

__all__ = ["main"]

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MNT_DETACH = 1, 32, 4096, 2
_KEPT_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048,
               "strictatime": 1 << 24}


def _check(result: int, what: str) -> None:
    if result != 0:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")


def main(argv: list[str]) -> None:
    pid, repairs = int(argv[1]), json.loads(argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY)
    namespace = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    _check(libc.setns(namespace, _CLONE_NEWNS), "setns")
    os.fchdir(root)
    _check(libc.chroot(b"."), "chroot")
    for kind, path, options in repairs:
        target = path.encode()
        if kind == "readonly-root":
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY
            for option in options:
                flags |= _KEPT_FLAGS.get(option, 0)
            _check(libc.mount(None, target, None, flags, None), f"remount {path} read-only")
        elif kind == "mask":
            _check(libc.umount2(target, _MNT_DETACH), f"unmount {path}")
            _check(libc.mount(b"/dev/null", target, None, _MS_BIND, None), f"mask {path}")
        else:
            sys.exit(f"unknown repair {kind!r}")


if __name__ == "__main__":
    main(sys.argv)
