"""What the desktop's work raises; the service turns each into a CallError of the protocol."""

from __future__ import annotations

__all__ = ["DesktopError", "DesktopFailed", "InvalidAction", "Timeout"]


class DesktopError(Exception):
    status = 500
    kind = "desktop_failed"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        # In a batch, the index of the action that failed; those before it were done.
        self.action: int | None = None


class InvalidAction(DesktopError):
    """The request cannot be done as asked (bad field, a point off the screen, an unknown key)."""

    status = 422
    kind = "invalid_action"


class DesktopFailed(DesktopError):
    """The X server is gone or broke the connection: this desktop cannot go on."""

    status = 503
    kind = "desktop_failed"


class Timeout(DesktopError):
    """Something on the desktop (a clipboard owner, a window) did not answer in time."""

    status = 504
    kind = "timeout"
