"""Scripted solvers of the example tasks: the proof that each task can be solved.

``solve`` is an agent as ``deskbox eval`` runs them (``--agent tasks/solvers.py:solve``): it
gets the observation and the instruction and returns the next actions. It sees only pixels,
as a model does: every target on the example pages has a colour of its own, which it finds
in the observation. ``noop`` observes and does nothing (it must score 0: the proof that a
reward is not given away).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from deskbox.tasks import Task

Observation = NDArray[np.uint8]
Actions = list[dict[str, Any]]
Policy = Callable[[Observation], Actions]

NOTHING: Actions = [{"type": "wait", "ms": 0}]


def find(observation: Observation, colour: str) -> tuple[int, int] | None:
    """The middle of the pixels of exactly ``colour`` (``#rrggbb``), if any are on screen."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    ys, xs = np.nonzero(np.all(observation == rgb, axis=2))
    if len(xs) < 50:  # a few stray pixels of anti-aliasing are not a target
        return None
    return int(np.median(xs)), int(np.median(ys))


def click(observation: Observation, colour: str) -> dict[str, Any]:
    point = find(observation, colour)
    if point is None:
        raise LookupError(f"nothing of colour {colour} on the screen")
    return {"type": "click", "x": point[0], "y": point[1]}


def click_button(obs: Observation) -> Actions:
    return [click(obs, "#1e88e5")]


def fill_form(obs: Observation) -> Actions:
    return [click(obs, "#fff3e0"), {"type": "type", "text": "Ada Lovelace"},
            click(obs, "#e8f5e9"), {"type": "type", "text": "ada@example.org"},
            click(obs, "#6a1b9a")]


def type_unicode(obs: Observation) -> Actions:
    return [click(obs, "#fffde7"),
            {"type": "type", "text": "Grüße aus Köln — 東京で会いましょう 🚀"}]


def keyboard_shortcut(obs: Observation) -> Actions:
    return [click(obs, "#e3f2fd"), {"type": "key", "keys": "ctrl+Return"}]


def drag_to_target(obs: Observation) -> Actions:
    start, end = find(obs, "#e53935"), find(obs, "#43a047")
    if start is None or end is None:
        raise LookupError("no parcel or no bin on the screen")
    path = [[round(start[0] + (end[0] - start[0]) * i / 10),
             round(start[1] + (end[1] - start[1]) * i / 10)] for i in range(11)]
    return [{"type": "drag", "path": path}]


def scroll_to_find(obs: Observation) -> Actions:
    if find(obs, "#00897b") is not None:
        return [click(obs, "#00897b")]
    height, width = obs.shape[:2]
    return [{"type": "scroll", "x": width // 2, "y": height // 2, "dy": 10}]


def multi_tab(obs: Observation) -> Actions:
    if find(obs, "#fb8c00") is not None:  # the report's tab is in front
        return [click(obs, "#fb8c00")]
    # A new tab takes a while to paint; look again once it has.
    return [click(obs, "#5e35b1"), {"type": "wait", "ms": 500}]


def download_file(obs: Observation) -> Actions:
    return [click(obs, "#3949ab"), {"type": "wait", "ms": 500}]


def select_option(obs: Observation) -> Actions:
    # Clicking opens the list; typed letters pick an entry and Return closes it. Chromium
    # closes the list asynchronously: a click at once would only close it.
    return [click(obs, "#f3e5f5"), {"type": "wait", "ms": 300},
            {"type": "type", "text": "Mars"}, {"type": "key", "keys": "Return"},
            {"type": "wait", "ms": 300}, click(obs, "#00acc1")]


def checkboxes(obs: Observation) -> Actions:
    even_rows = ["#c8e6c9", "#fff9c4", "#ffe0b2"]  # the rows of 2, 4 and 6
    return [*(click(obs, colour) for colour in even_rows), click(obs, "#37474f")]


def navigate_link(obs: Observation) -> Actions:
    return [click(obs, "#2e7d32")]


def copy_to_clipboard(obs: Observation) -> Actions:
    return [{**click(obs, "#fff8e1"), "count": 3}, {"type": "key", "keys": "ctrl+c"}]


def terminal_command(obs: Observation) -> Actions:
    # The terminal is the black window over the white page (most black pixels are its).
    return [click(obs, "#000000"),
            {"type": "type", "text": "mkdir -p /root/notes && echo 'buy milk' > "
                                     "/root/notes/todo.txt\n"}]


POLICIES: dict[str, Policy] = {
    "click-button": click_button,
    "fill-form": fill_form,
    "type-unicode": type_unicode,
    "keyboard-shortcut": keyboard_shortcut,
    "drag-to-target": drag_to_target,
    "scroll-to-find": scroll_to_find,
    "multi-tab": multi_tab,
    "download-file": download_file,
    "select-option": select_option,
    "checkboxes": checkboxes,
    "navigate-link": navigate_link,
    "copy-to-clipboard": copy_to_clipboard,
    "terminal-command": terminal_command,
}
TASKS_DIR = Path(__file__).resolve().parent
_BY_INSTRUCTION = {
    task.instruction: POLICIES[task.id]
    for task in (Task.load(path) for path in sorted(TASKS_DIR.glob("*.yaml")))
}


def solve(observation: Observation, instruction: str) -> Actions:
    """The next actions of the example task whose instruction this is."""
    return _BY_INSTRUCTION[instruction](observation)


def noop(observation: Observation, instruction: str) -> Actions:
    return NOTHING
