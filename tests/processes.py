"""The host's process tree, as the tests and bench/ (through its path to tests/) read it."""

from __future__ import annotations

from pathlib import Path

__all__ = ["descendants"]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (zombies too), from each one's parent in /proc/*/stat
    (no kernel option needed, unlike /proc/PID/task/*/children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
