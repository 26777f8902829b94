"""Python evaluators of the example tasks (``type: python``, ``callable: checks.py:NAME``).

Each is called as ``fn(session, task, **args)`` after every step and returns the reward.
"""

from __future__ import annotations

from deskbox import Session
from deskbox.tasks import Task


def clipboard_is(session: Session, task: Task, text: str) -> float:
    """1 when the desktop's clipboard holds ``text`` (surrounding whitespace aside: a
    triple-click selects the line with its end)."""
    answer = session.act({"type": "clipboard_get"}).results[0]
    held = answer.get("text") if isinstance(answer, dict) else None
    return 1.0 if isinstance(held, str) and held.strip() == text else 0.0
