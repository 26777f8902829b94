"""The scheduling policy of the commands the agent runs: ``SCHED_IDLE`` when the sandbox's
init asks for it (``DESKBOX_IDLE_COMMANDS``, spawner.py), the normal policy otherwise, and
the agent itself always at the normal policy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from deskbox_server.agent import AgentClient, AgentLimits

from .conftest import agent_env, stop_agent, wait_listening
from .test_agent_rpc import run

SCHED_OTHER, SCHED_IDLE = 0, 5

# The command's policy, its child's, and whether the variable reached the command.
REPORT = ("grep ^policy /proc/self/sched; sh -c 'grep ^policy /proc/self/sched'; "
          "echo ${DESKBOX_IDLE_COMMANDS-unset}")


def policy_of(task: Path) -> int:
    for line in (task / "sched").read_text().splitlines():
        if line.startswith("policy"):
            return int(line.split(":")[1])
    raise AssertionError(f"no policy in {task}/sched")


def policies(pid: int) -> dict[int, int]:
    """Each thread's policy, by thread id."""
    return {int(task.name): policy_of(task) for task in Path(f"/proc/{pid}/task").iterdir()}


@pytest.fixture(scope="module")
def idle_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    path = tmp_path_factory.mktemp("idle-agent") / "agent.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deskbox_agent", "--listen", f"unix:{path}"],
        env={**agent_env(), "DESKBOX_IDLE_COMMANDS": "1"}, stderr=subprocess.PIPE)
    try:
        wait_listening(proc, path)
        yield path, proc.pid
    finally:
        stop_agent(proc)


@pytest_asyncio.fixture(loop_scope="function")
async def idle_client(idle_agent: tuple[Path, int]) -> AsyncIterator[AgentClient]:
    client = await AgentClient.connect_unix(str(idle_agent[0]), AgentLimits())
    try:
        yield client
    finally:
        await client.close()


async def test_commands_run_at_sched_idle_when_asked(
    idle_client: AgentClient, idle_agent: tuple[Path, int]
) -> None:
    chunks, status = await run(idle_client, ["sh", "-c", REPORT])
    assert status.exit_code == 0
    lines = b"".join(c.data for c in chunks).decode().split("\n")
    assert [int(line.split(":")[1]) for line in lines[:2]] == [SCHED_IDLE, SCHED_IDLE], lines
    assert lines[2] == "unset"  # the init's word for the agent, not in the command's env
    pid = idle_agent[1]
    tasks = policies(pid)
    # The agent's own threads (its loop above all, the main thread) keep the normal policy;
    # only the thread that forks the commands is idle.
    assert tasks.pop(pid) == SCHED_OTHER
    assert sorted(tasks.values()) == [SCHED_OTHER] * (len(tasks) - 1) + [SCHED_IDLE], tasks


async def test_commands_run_at_the_normal_policy_otherwise(client: AgentClient) -> None:
    chunks, status = await run(client, ["sh", "-c", REPORT])
    assert status.exit_code == 0
    lines = b"".join(c.data for c in chunks).decode().split("\n")
    assert [int(line.split(":")[1]) for line in lines[:2]] == [SCHED_OTHER, SCHED_OTHER], lines
