"""Waiting for file descriptors to become readable, without select(2)'s limit.

select() takes descriptors below FD_SETSIZE (1024) only, and Python's raises ValueError
for any other: a server holding over a thousand descriptors (a few hundred sessions and
their clients) failed every wait on a descriptor it opened after that, such as a new
sandbox's pidfd. poll(2) has no such limit.
"""

from __future__ import annotations

import math
import select
from collections.abc import Iterable

__all__ = ["readable"]


def readable(fds: Iterable[int], timeout_s: float = 0.0) -> set[int]:
    """Those of ``fds`` that are readable (or hung up: a pidfd whose process exited, a pipe
    whose writer closed) within ``timeout_s``; at once for 0."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _events in poller.poll(math.ceil(max(0.0, timeout_s) * 1000))}
