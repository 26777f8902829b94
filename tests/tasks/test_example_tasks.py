"""Every example task in tasks/ is solvable and does not give its reward away: its scripted
solver (tasks/solvers.py, which sees only the observation's pixels) reaches reward 1 within
the task's limits, and a policy that only observes gets 0. Both run as ``DeskboxEnv``
episodes on real desktops, with the task's own setup and evaluator."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskbox import Deskbox
from deskbox.gym import DeskboxEnv

from .conftest import EXAMPLE_TASKS, TASKS_DIR, live_sessions, solver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NOOP_STEPS = 3


def test_there_are_at_least_twelve_examples() -> None:
    assert len(EXAMPLE_TASKS) >= 12


@pytest.mark.parametrize("path", EXAMPLE_TASKS, ids=lambda p: p.stem)
def test_the_scripted_solver_reaches_reward_1(box: Deskbox, path: Path) -> None:
    solve = solver("solve")
    env = DeskboxEnv(client=box, task=path)
    assert env.task is not None
    try:
        observation, info = env.reset(seed=0)
        assert info["instruction"] == env.task.instruction
        reward, terminated, steps = 0.0, False, 0
        while not terminated:
            observation, score, terminated, truncated, info = env.step(
                solve(observation, info.get("instruction", env.task.instruction)))
            reward, steps = float(score), steps + 1
            assert "error" not in info, info["error"]
            assert not truncated, f"not solved in {steps} steps: {info['evaluation']}"
        assert reward == 1.0 and steps <= env.task.limits.max_steps
    finally:
        env.close()
    assert live_sessions(box) == []


@pytest.mark.parametrize("path", EXAMPLE_TASKS, ids=lambda p: p.stem)
def test_doing_nothing_scores_0(box: Deskbox, path: Path) -> None:
    noop = solver("noop")
    with DeskboxEnv(client=box, task=path) as env:
        assert env.task is not None
        observation, info = env.reset(seed=0)
        for _ in range(NOOP_STEPS):
            observation, reward, terminated, truncated, info = env.step(
                noop(observation, env.task.instruction))
            assert (reward, terminated) == (0.0, False), info["evaluation"]
        assert info["evaluation"]  # the evaluator said what it found


def test_trying_every_destination_in_turn_scores_0(box: Deskbox) -> None:
    """select-option: a policy that saves one destination after another, a step each,
    reached Mars at its third step and was rewarded; only the first save counts now, as
    only the first choice does on the other pages of choices."""
    solve = solver("select_option")
    with DeskboxEnv(client=box, task=TASKS_DIR / "select-option.yaml") as env:
        observation, _ = env.reset(seed=0)
        for destination in ("Moon", "Venus", "Mars"):
            actions = [{**action, "text": destination} if action["type"] == "type" else action
                       for action in solve(observation)]
            observation, reward, terminated, _, info = env.step(actions)
            assert (reward, terminated) == (0.0, False), info["evaluation"]
        assert info["evaluation"] == "the expression is 'moon'"
