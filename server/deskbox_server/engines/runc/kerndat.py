"""CRIU's cache of what this kernel supports, kept where CRIU looks for it.

Every CRIU run starts by probing the kernel (``kerndat``: test mappings, sockets, and
``iptables -L`` to load netfilter modules), about 30 ms, and saves the result to
``/run/criu.kdat`` so that later runs skip it. It saves it only when ``/run`` is a tmpfs, so
that a reboot into another kernel cannot leave a stale cache behind. On a host whose ``/run``
is an ordinary disk (this development machine's is ext4) no run ever saves it, and each of a
fork ×4's five CRIU runs paid the probe again (bench/README.md: 90 ms of the fork).

So the server makes the cache itself, once per boot: a ``criu check`` in a private mount
namespace whose ``/run`` is a tmpfs, its cache copied out to the real ``/run``. CRIU reads
a cache from any filesystem and checks its magic (its own version); the boot-time check
here stands in for the tmpfs's reboot rule.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

__all__ = ["KERNDAT_CACHE", "keep_kerndat_cache"]

log = logging.getLogger(__name__)

KERNDAT_CACHE = Path("/run/criu.kdat")
# The cache is a C struct of a few hundred bytes; anything larger is not one.
_CACHE_LIMIT = 1 << 16
# In a private mount namespace: /run becomes an empty tmpfs there only, CRIU's check saves
# its cache into it, and the cache goes to standard output.
_MAKE_CACHE = (
    'mount -t tmpfs -o size=1m,mode=0755 deskbox-criu-kdat /run && '
    '"$1" check >/dev/null 2>&1; exec cat /run/criu.kdat'
)


def _run_fstype() -> str:
    """The type of the filesystem holding /run: its own mount's, else the root's (of a
    mount point listed twice, the later line is the mount on top)."""
    types: dict[str, str] = {}
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2:
                types[fields[1]] = fields[2]
    return types.get("/run", types.get("/", ""))


def _boot_time() -> float:
    with open("/proc/stat", encoding="ascii") as stat:
        for line in stat:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def _fresh(cache: Path, wrapper: Path) -> bool:
    """Made since this boot, and since CRIU was last installed (scripts/criu.sh rewrites
    the wrapper)."""
    try:
        made = cache.stat().st_mtime
        return made > _boot_time() and made >= wrapper.stat().st_mtime
    except OSError:
        return False


def keep_kerndat_cache(wrapper: Path, cache: Path = KERNDAT_CACHE) -> bool:
    """Make CRIU's kernel cache if CRIU cannot keep one itself; whether one is in place.

    Never raises: without the cache CRIU probes the kernel on every run, as before.
    """
    if _run_fstype() == "tmpfs" or _fresh(cache, wrapper):
        return True
    try:
        made = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MAKE_CACHE,
             "sh", str(wrapper)],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("CRIU will probe the kernel on every run: %s", error)
        return False
    if made.returncode != 0 or not 0 < len(made.stdout) <= _CACHE_LIMIT:
        log.warning("CRIU will probe the kernel on every run: its check left no cache (%s)",
                    made.stderr[-500:].decode(errors="replace").strip() or made.returncode)
        return False
    partial = cache.with_name(f"{cache.name}.deskbox-{os.getpid()}")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(made.stdout)
        os.replace(partial, cache)
    except OSError as error:
        partial.unlink(missing_ok=True)
        log.warning("CRIU will probe the kernel on every run: %s", error)
        return False
    return True
