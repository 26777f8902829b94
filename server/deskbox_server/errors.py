"""The one exception tree of Deskbox.

Every failure the server can report is a :class:`DeskboxError`; ``api/errors.py`` maps
each kind to the error body of API.md in one place. The tree::

    DeskboxError                      kind         HTTP
    ├── InvalidRequest                invalid_request  422
    │   └── InvalidAction             invalid_request  422  (an action the desktop cannot do)
    ├── Unauthorized                  unauthorized     401
    ├── Forbidden                     forbidden        403
    │   └── SecretOriginMismatch      secret_origin_mismatch 403 (a secret's page is not
    │                                                        focused)
    ├── NotFound                      not_found        404
    ├── Conflict                      conflict         409
    │   ├── HumanInControl            human_in_control 409  (a human took the desktop over)
    │   └── BrowserUnavailable        conflict         409  (the browser does not answer)
    ├── Capacity                      capacity         429  (frees itself: Retry-After)
    ├── QuotaExceeded                 quota_exceeded   429  (only a delete of the key's
    │                                                        own frees it: no Retry-After)
    ├── Timeout                       timeout          504
    ├── InsufficientStorage           insufficient_storage 507 (no room on the server's
    │                                                        disk to keep a checkpoint)
    ├── SessionFailed                 session_failed   502
    │   ├── DesktopFailed             session_failed   502  (a desktop process died)
    │   ├── AgentFailed               session_failed   502  (the sandbox's agent broke the
    │   │                                                    protocol, went silent or away)
    │   └── UpstreamRefused           session_failed   502  (the container engine's or the
    │                                                        Kubernetes API refused)
    ├── Internal                      internal         500
    └── InvalidSetting                (never answered: a DESKBOX_* setting or a serve
                                       option the server cannot start with)
"""

from __future__ import annotations

import errno
import os

__all__ = [
    "AgentFailed",
    "BrowserUnavailable",
    "Capacity",
    "CheckpointUnavailable",
    "Conflict",
    "DesktopFailed",
    "DeskboxError",
    "Forbidden",
    "HumanInControl",
    "InsufficientStorage",
    "Internal",
    "InvalidAction",
    "InvalidRequest",
    "InvalidSetting",
    "NO_ROOM",
    "NotFound",
    "QuotaExceeded",
    "SecretOriginMismatch",
    "SessionFailed",
    "Timeout",
    "Unauthorized",
    "UpstreamRefused",
    "says_no_room",
]


class DeskboxError(Exception):
    """Root of every error Deskbox reports; ``kind`` and ``status`` select the HTTP answer."""

    kind = "internal"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # For a batch of actions: the index of the one that failed, the actions before it
        # done and those after it not (API.md "Errors"); None when no one action did.
        self.action_index: int | None = None


class InvalidRequest(DeskboxError):
    kind = "invalid_request"
    status = 422


class CheckpointUnavailable(InvalidRequest):
    """The engine cannot checkpoint this sandbox now (CRIU's dump, QEMU's save refused or
    failed); the message says why, and the session runs on as it was."""


class InvalidAction(InvalidRequest):
    """An action that is well-formed JSON but impossible on this desktop."""


class Unauthorized(DeskboxError):
    kind = "unauthorized"
    status = 401


class Forbidden(DeskboxError):
    kind = "forbidden"
    status = 403


class SecretOriginMismatch(Forbidden):
    """A secret was to be typed where no page of its allowed origins has the focus."""

    kind = "secret_origin_mismatch"


class NotFound(DeskboxError):
    kind = "not_found"
    status = 404


class Conflict(DeskboxError):
    kind = "conflict"
    status = 409


class BrowserUnavailable(Conflict):
    """The session runs but its browser does not answer (it is restarting, or gone)."""


class HumanInControl(Conflict):
    """A human took control of the session in its live view: the agent's actions wait."""

    kind = "human_in_control"


class Capacity(DeskboxError):
    kind = "capacity"
    status = 429

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(DeskboxError):
    """A key's stored things (snapshots, volumes, recordings, secrets) fill its quota.

    Not a :class:`Capacity`: waiting frees nothing, so the answer has no Retry-After and a
    client that retries refusals for capacity does not wait on it."""

    kind = "quota_exceeded"
    status = 429


class Timeout(DeskboxError):
    kind = "timeout"
    status = 504


class InsufficientStorage(DeskboxError):
    """The server's disk has no room to keep a checkpoint; the session is as it was."""

    kind = "insufficient_storage"
    status = 507


# A write the disk refuses for want of room, a full file system or a quota: where the
# server meets one it answers InsufficientStorage. Not a file size limit's EFBIG: no room
# made frees that one, and QEMU's save that meets it is a failed save
# (CheckpointUnavailable, tests/vm/test_vm_saves.py). The registry (SQLite's I/O error)
# and the recordings' saves, tried again later, count it too: see there.
NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def says_no_room(said: str) -> bool:
    """Whether a program's message (QEMU's, CRIU's, tar's) names one of ``NO_ROOM``."""
    return any(os.strerror(code) in said for code in NO_ROOM)


class SessionFailed(DeskboxError):
    kind = "session_failed"
    status = 502


class DesktopFailed(SessionFailed):
    """A process of the desktop (X server, window manager, browser) is gone."""


class AgentFailed(SessionFailed):
    """The connection to a sandbox's agent is unusable: ``reason`` says why.

    Raised for every call of that connection once it failed; other sessions' agents are
    not affected. The agent runs in the sandbox and is as hostile as anything there.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the session's agent failed: {reason}")
        self.reason = reason


class UpstreamRefused(SessionFailed):
    """An API the server drives for a session (a container engine's, Kubernetes')
    answered ``what`` with an error status, kept as ``upstream_status``: our answer stays
    a 502, as a 404 or a 500 of theirs is none of ours."""

    def __init__(self, who: str, what: str, status: int, message: str) -> None:
        super().__init__(f"{who} refused to {what} ({status}: {message})")
        self.upstream_status = status


class Internal(DeskboxError):
    kind = "internal"
    status = 500


class InvalidSetting(DeskboxError):
    """A setting (``DESKBOX_*``, or the ``deskbox serve`` option that stands for one) the
    server cannot start with. Raised before anything is served; the message names the
    setting, so an operator reads one line, not a traceback."""
