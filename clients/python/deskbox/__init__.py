"""Deskbox: disposable desktops for computer-use agents (Python client and CLI).

::

    from deskbox import Deskbox

    with Deskbox() as box:                      # DESKBOX_URL / DESKBOX_API_KEY, or arguments
        with box.sessions.create() as session:  # deleted when the block ends
            session.click(640, 400)
            session.type("hello")
            png = session.screenshot()

:class:`AsyncDeskbox` has the same methods, awaited. Errors are :class:`DeskboxError`\\ s
(see ``deskbox._errors`` for the tree).
"""

from __future__ import annotations

from ._async import (
    AsyncActionsSocket,
    AsyncDeskbox,
    AsyncSecrets,
    AsyncSession,
    AsyncSessions,
    AsyncSnapshots,
    AsyncVolumes,
)
from ._errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    BadRequest,
    Conflict,
    DeskboxError,
    Forbidden,
    GatewayTimeout,
    InsufficientStorage,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    RequestTimeout,
    ServerError,
    ServiceUnavailable,
    SessionFailed,
    Unauthorized,
    UnprocessableEntity,
)
from ._models import (
    ActionsResult,
    AnthropicResult,
    Display,
    ExecResult,
    OpenAIResult,
    Screenshot,
    SessionData,
    SessionUrls,
    Snapshot,
    Token,
    Upload,
    Volume,
)
from ._sync import (
    ActionsSocket,
    Deskbox,
    Secrets,
    Session,
    Sessions,
    Snapshots,
    Volumes,
)

__all__ = [
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "ActionsResult",
    "ActionsSocket",
    "AnthropicResult",
    "AsyncActionsSocket",
    "AsyncDeskbox",
    "AsyncSession",
    "AsyncSessions",
    "AsyncSecrets",
    "AsyncSnapshots",
    "AsyncVolumes",
    "BadRequest",
    "Conflict",
    "Deskbox",
    "DeskboxError",
    "Display",
    "ExecResult",
    "Forbidden",
    "GatewayTimeout",
    "InsufficientStorage",
    "MethodNotAllowed",
    "NotFound",
    "OpenAIResult",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "RequestTimeout",
    "Screenshot",
    "Secrets",
    "ServerError",
    "ServiceUnavailable",
    "Session",
    "SessionData",
    "SessionFailed",
    "SessionUrls",
    "Sessions",
    "Snapshots",
    "Snapshot",
    "Token",
    "Unauthorized",
    "UnprocessableEntity",
    "Upload",
    "Volume",
    "Volumes",
    "__version__",
]

__version__ = "0.1.0"
