"""Deletes the API server failed, asked again in the background by the live replica.

A session's pod, Secret or NetworkPolicy whose delete the API server failed (a 5xx, or no
answer: an API server restarting behind its load balancer, etcd electing a leader) stayed
until the next start's orphan sweep, or a judge's after this replica's Lease expired: a
pod that went on running its desktop, for days on a long-lived replica. Each such object
is asked again, backing off from _FIRST_BACKOFF_S to _MAX_BACKOFF_S, for up to
_RETRY_FOR_S; once at a time per object (a second failure of the same one joins the
retry under way); all of them cancelled at close. A delete is safe to send again: one the
API server did after all answers 404, which is done.

One the API server still fails then, or refuses for good (a 4xx: the Role lacks the
verb, an admission webhook denies it), is given up: logged as an error with the command
that deletes it, and kept in :attr:`DeleteRetries.lingering` (until a later retry of it
passes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from ...errors import DeskboxError, Internal
from .cluster import ClusterRefused

__all__ = ["DeleteRetries"]

log = logging.getLogger("deskbox.kubernetes")
# The first retry is soon (a lost connection, one 503 of a restarting API server), the
# later ones no more often than this: a replica may have many objects to delete at once.
_FIRST_BACKOFF_S = 0.5
_MAX_BACKOFF_S = 30.0
# An API server's restart or an etcd leader election is over within minutes; one that
# fails a delete for longer is broken in a way a retry does not mend.
_RETRY_FOR_S = 600.0

Delete = Callable[[str], Awaitable[bool]]  # whether there was one to delete


def _retryable(error: DeskboxError) -> bool:
    """Whether a later try may pass: no answer, a 5xx, a 429 (asked again within the
    call's bound already) or a 408; not another 4xx, which the next try gets again."""
    if not isinstance(error, ClusterRefused):
        return True
    status = error.upstream_status
    return not 400 <= status < 500 or status in (408, 429)


class DeleteRetries:
    """``deletes``: the delete of each kind by name (``"pod"``: ``Cluster.delete_pod``)."""

    def __init__(self, deletes: Mapping[str, Delete], namespace: Callable[[], str],
                 retry_for_s: float = _RETRY_FOR_S,
                 first_backoff_s: float = _FIRST_BACKOFF_S) -> None:
        self._deletes = deletes
        self._namespace = namespace
        self._retry_for_s = retry_for_s
        self._first_backoff_s = first_backoff_s
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._lingering: dict[tuple[str, str], str] = {}  # (kind, name): the last error
        self._closed = False

    @property
    def pending(self) -> list[tuple[str, str]]:
        """The (kind, name) of each object being retried now."""
        return sorted(self._pending)

    @property
    def lingering(self) -> dict[tuple[str, str], str]:
        """The objects given up, (kind, name), each with the last error."""
        return dict(self._lingering)

    def add(self, kind: str, name: str, error: DeskboxError) -> None:
        """Delete this object again in the background: its delete failed with ``error``."""
        key = (kind, name)
        if key in self._pending:
            return
        if self._closed or not _retryable(error):
            self._give_up(key, error, 1, 0.0)
            return
        self._pending[key] = asyncio.create_task(
            self._retry(key, error), name=f"deskbox-kubernetes-delete-{kind}-{name}")

    async def close(self) -> None:
        """Stop every retry (the server stops): what is left is logged, for the next
        start's orphan sweep, or for the other replicas once this one's Lease expired."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for task in pending.values():
            task.cancel()
        for task in pending.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if pending:
            log.warning("kubernetes: %d deletes were still being retried at shutdown and "
                        "are left: %s", len(pending),
                        ", ".join(f"the {kind} {name}" for kind, name in sorted(pending)))

    async def _retry(self, key: tuple[str, str], last: DeskboxError) -> None:
        kind, name = key
        started, backoff_s, tries = time.monotonic(), self._first_backoff_s, 1
        try:
            while True:
                if time.monotonic() - started + backoff_s > self._retry_for_s:
                    self._give_up(key, last, tries, time.monotonic() - started)
                    return
                await asyncio.sleep(backoff_s)
                backoff_s = min(2 * backoff_s, _MAX_BACKOFF_S)
                tries += 1
                try:
                    await self._deletes[kind](name)
                except DeskboxError as error:
                    last = error
                    if not _retryable(error):
                        self._give_up(key, error, tries, time.monotonic() - started)
                        return
                    continue
                except Exception as error:  # not the API server's answer: no retry mends it
                    log.exception("kubernetes: deleting the %s %s", kind, name)
                    self._give_up(key, Internal(f"{type(error).__name__}: {error}"), tries,
                                  time.monotonic() - started)
                    return
                self._lingering.pop(key, None)
                log.info("kubernetes: deleted the %s %s at its try %d, %.0f s after the "
                         "first failed", kind, name, tries, time.monotonic() - started)
                return
        finally:
            if self._pending.get(key) is asyncio.current_task():
                del self._pending[key]

    def _give_up(self, key: tuple[str, str], error: DeskboxError, tries: int,
                 for_s: float) -> None:
        kind, name = key
        self._lingering[key] = error.message
        resource = {"network policy": "networkpolicy"}.get(kind, kind)
        log.error("kubernetes: the %s %s is left in the cluster (%d tries of its delete in "
                  "%.0f s, the last: %s); delete it with 'kubectl delete %s %s -n %s'",
                  kind, name, tries, for_s, error.message, resource, name, self._namespace())
