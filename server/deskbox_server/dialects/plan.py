"""What a dialect asks of a session: our actions, and which of their results answers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import InvalidRequest
from ..keys import parse_combo
from ..schemas import actions as a

__all__ = ["Plan", "build", "check_keys"]

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


def check_keys(combos: Iterable[str]) -> None:
    """Reject unknown key names before anything runs, so a bad key never half-acts."""
    for combo in combos:
        parse_combo(combo)
