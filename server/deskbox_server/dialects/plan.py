"""What a dialect asks of a session: our actions, and which of their results answers."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import InvalidAction, InvalidRequest
from ..keys import parse_combo
from ..schemas import actions as a

__all__ = ["Plan", "build", "check_call", "check_keys", "type_actions"]

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Plan:
    """Run ``actions`` in order, then answer.

    With ``screenshot`` set, the answer is a screenshot taken once the screen has settled
    after the last action. Without it, the answer is the last action's own result: an image
    (``screenshot``, ``zoom``) or the pointer position (``cursor_position``).
    """

    actions: tuple[a.Action, ...]
    screenshot: a.Screenshot | None = None


def build(model: type[M], **fields: Any) -> M:
    """One of our actions from translated fields; a value out of our bounds is a 422."""
    try:
        return model(**fields)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
            for e in error.errors()[:3]
        )
        raise InvalidRequest(f"invalid {model.__name__.lower()} action: {problems}") from None


# A model names a secret in its text instead of knowing it (API.md "Secrets").
_SECRET = re.compile(r"\{\{secret:([A-Za-z_][A-Za-z0-9_]{0,63})\}\}")


def type_actions(text: str) -> tuple[a.TypeText, ...]:
    """A dialect's ``type`` text as our type actions: its ``{{secret:NAME}}`` parts become
    type actions of that secret (the server types the value, after its focus check)."""
    actions: list[a.TypeText] = []
    position = 0
    for match in _SECRET.finditer(text):
        if match.start() > position:
            actions.append(build(a.TypeText, text=text[position:match.start()]))
        actions.append(a.TypeText(secret=match.group(1)))
        position = match.end()
    if position < len(text) or not actions:
        actions.append(build(a.TypeText, text=text[position:]))
    return tuple(actions)


def check_keys(combos: Iterable[str]) -> None:
    """Reject unknown key names before anything runs, so a bad key never half-acts."""
    for combo in combos:
        parse_combo(combo)


def _keys(action: a.Action) -> Iterable[str]:
    match action:
        case a.Key() | a.HoldKey():
            yield action.keys
        case a.Click() | a.Move() | a.Drag() | a.Scroll():
            yield from action.modifiers
        case _:
            return


def check_call(actions: Sequence[a.Action], width: int, height: int) -> None:
    """A vendor's call checked whole before any of it runs (API.md "Vendor dialects"): its
    key names, then its points (:func:`check_points`). Run inside the session's recorded
    batch, so that the refused call is kept as the actions it translated to."""
    check_keys(key for action in actions for key in _keys(action))
    check_points(actions, width, height)


def _points(action: a.Action) -> Iterable[tuple[int | None, int | None]]:
    match action:
        case a.Click() | a.Move() | a.MouseDown() | a.MouseUp() | a.Scroll():
            yield action.x, action.y
        case a.Drag():
            yield from action.path
        case _:
            return


def check_points(actions: Iterable[a.Action], width: int, height: int) -> None:
    """Reject a point off the ``width`` x ``height`` space before anything runs: the desktop
    checks each action's points only when its turn comes, and a vendor's call is one step
    of its model, which retries the whole call (a batch's text typed twice)."""
    for action in actions:
        for x, y in _points(action):
            if x is not None and y is not None and not (0 <= x < width and 0 <= y < height):
                # The desktop's own words (deskbox_agent.desktop.space).
                raise InvalidAction(f"point ({x}, {y}) is outside the {width}x{height} screen")
