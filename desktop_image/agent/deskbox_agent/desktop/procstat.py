"""One process's ``/proc/<pid>/stat``: its name and the fields after it."""

from __future__ import annotations

__all__ = ["proc_stat"]


def proc_stat(pid: int) -> tuple[bytes, list[bytes]] | None:
    """The process's name (field 2: its program's, unless it renamed itself) and fields 3
    on (``fields[0]`` is the state letter, ``fields[1]`` the parent's pid); None if it is
    gone. The name may hold spaces and parentheses: the fields follow its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            head, tail = stat.read(4096).rsplit(b")", 1)
    except (OSError, ValueError):
        return None
    return head.partition(b"(")[2], tail.split()
