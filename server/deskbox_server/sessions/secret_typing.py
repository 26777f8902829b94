"""Typing a secret: a batch cut where secrets are typed, and each secret's value put in its
``type`` action once the browser's focused field is of one of its allowed origins."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ..agent.devtools import Opener
from ..errors import SecretOriginMismatch
from ..schemas import actions as a
from .focus import focused_field_origin
from .secrets import SecretStore

__all__ = ["RECHECK_S", "check_names", "parts", "typed"]

# A refusal is asked again for this long: the click before a secret has been written to the
# X server when its turn comes, but the browser may take the focus a moment later (a page
# still loading, a handler that focuses the field itself), and refusing then would fail a
# batch that is right. A page that never answers is still refused once (focus.py's bound).
RECHECK_S = 1.0
_RECHECK_EVERY_S = 0.1


def _secret_of(action: a.Action) -> str | None:
    return action.secret if isinstance(action, a.TypeText) else None


async def check_names(store: SecretStore, owner: str, actions: Sequence[a.Action]) -> None:
    """NotFound for a secret the key does not have, before anything of the batch runs."""
    for action in actions:
        name = _secret_of(action)
        if name is not None:
            await asyncio.to_thread(store.get, owner, name)


def parts(actions: Sequence[a.Action]) -> list[list[a.Action]]:
    """The batch cut before each type action of a secret: each secret's focus is checked
    when its turn comes (after a click before it in the batch, say)."""
    cut: list[list[a.Action]] = [[]]
    for action in actions:
        if _secret_of(action) is not None and cut[-1]:
            cut.append([])
        cut[-1].append(action)
    return cut


async def typed(store: SecretStore, owner: str, part: list[a.Action],
                open_devtools: Opener) -> list[a.Action]:
    """``part`` with its first action's secret as text, once the browser's focused field is
    of one of the secret's allowed origins, asked again for ``RECHECK_S``; SecretOriginMismatch
    (403) otherwise. A part that starts with no secret as it is."""
    name = _secret_of(part[0]) if part else None
    if name is None:
        return part
    record = await asyncio.to_thread(store.get, owner, name)
    deadline = time.monotonic() + RECHECK_S
    while True:
        focus = await focused_field_origin(open_devtools)
        refusal = _refusal(name, record.allowed_origins, focus)
        if refusal is None:
            return [a.TypeText(text=store.value(record)), *part[1:]]
        if time.monotonic() >= deadline:
            raise refusal
        await asyncio.sleep(_RECHECK_EVERY_S)


def _refusal(name: str, allowed: Sequence[str],
             focus: tuple[str | None, bool] | None) -> SecretOriginMismatch | None:
    if focus is None:
        return SecretOriginMismatch(
            f"secret {name!r} is not typed: no page has the keyboard focus (the address bar, "
            "another window?), or the browser did not say in time; click the field first")
    origin, editable = focus
    if origin not in allowed:
        return SecretOriginMismatch(
            f"secret {name!r} is not typed: the focused field is on "
            f"{origin or 'a frame of another origin'}, not on {', '.join(allowed)}")
    if not editable:
        return SecretOriginMismatch(
            f"secret {name!r} is not typed: the focus on {origin} is not in a text field; "
            "click the field first")
    return None
