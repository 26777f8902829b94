"""The scheduling policies of a sandbox's processes, as a shell inside it reads them."""

from __future__ import annotations

__all__ = ["POLICIES", "SCHED_IDLE", "SCHED_OTHER", "policies_by_name"]

SCHED_OTHER, SCHED_IDLE = 0, 5

# Every thread of every process of the sandbox: its process's name and its policy. The
# command's own shell and grep are SCHED_IDLE when the agent runs it, SCHED_OTHER under
# `runc exec`.
POLICIES = ("for t in /proc/[0-9]*/task/[0-9]*; do "
            "echo $(cat ${t%/task/*}/comm) $(grep ^policy $t/sched | tr -dc 0-9); done")


def policies_by_name(output: str) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for line in output.splitlines():
        name, _, value = line.strip().rpartition(" ")
        if name and value:
            found.setdefault(name, []).append(int(value))
    return found
