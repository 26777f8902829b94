"""How the screen counts as settled, and how long an action batch may legitimately take.

The worker gives every call a base deadline (the server's ``desktop_call_timeout_s``: X
round trips, encoding a large screenshot, a CPU-capped sandbox). An action batch may take
longer by design: ``wait``, ``hold_key`` durations, drag steps, typing, and the bounded
waits the driver makes for the screen to settle. :func:`batch_allowance_s` adds those up, so
that only a desktop that stops answering (a stopped or grabbed X server) passes its deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .schemas import actions as a

__all__ = ["SettleOptions", "batch_allowance_s"]


@dataclass(frozen=True)
class SettleOptions:
    """The screen counts as settled after ``quiet_s`` without damage (at most ``timeout_s``)."""

    quiet_s: float = 0.1
    timeout_s: float = 2.0
    drag_step_s: float = 0.02
    # A key sent right after a click can overtake it (ctrl+a hits the old focus): the window
    # manager's click-to-focus holds the click until it has had its turn. Keys right after
    # a button event wait until the click is through and the screen has been quiet this
    # long since it (given up 0.12 s later on a screen that keeps changing).
    click_to_key_s: float = 0.03
    # How long the screen must stay unchanged after typing on lent keycodes before one is
    # given back or lent to another character (the agent's Keyboard._borrow). Longer than a CFS
    # period (100 ms): a CPU-capped browser stalls that long while keys are still queued.
    typing_quiet_s: float = 0.2

# The agent's own bounded waits around a key action (desktop/actions.py): buttons landing
# (0.5 s), the typed keys shown (1 s), the clients re-reading a borrowed key mapping (1 s).
_KEY_WAITS_S = 2.5
_PER_ACTION_S = 0.1  # X round trips of one pointer action, with room to spare
_PER_CHAR_S = 0.02  # ≈ 0.7 ms a character measured; a CPU-capped browser is slower
_CLIPBOARD_S = 2.0 + 2.0  # the owner's answer (clipboard.py), and taking the selection


def batch_allowance_s(
    actions: Sequence[a.Action], screenshot: a.Screenshot | None, settle: SettleOptions
) -> float:
    """Seconds the batch may take beyond the base deadline."""
    total = settle.timeout_s if screenshot is not None else 0.0
    for action in actions:
        total += _PER_ACTION_S
        match action:
            case a.Wait():
                total += action.ms / 1000
            case a.HoldKey():
                total += action.duration_s + _KEY_WAITS_S
            case a.Key():
                total += _KEY_WAITS_S
            case a.TypeText():
                total += _KEY_WAITS_S + len(action.text) * _PER_CHAR_S
            case a.Drag():
                total += len(action.path) * (settle.drag_step_s + 0.005)
                if action.modifiers:
                    total += _KEY_WAITS_S
            case a.ClipboardGet() | a.ClipboardSet():
                total += _CLIPBOARD_S
            case a.Click() | a.Scroll() | a.Move() if action.modifiers:
                total += _KEY_WAITS_S
    return total
