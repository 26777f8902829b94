"""Resets from a task's start state kept as a snapshot (``pool``): the first reset sets the
task up and snapshots it; the others are copies of it, claimed from the snapshot's pool or
restored. 20 resets show the same first observation, pixel for pixel; what an episode did
is gone at the next reset; closing deletes the snapshot and its copies."""

from __future__ import annotations

import time

import numpy as np
import pytest

from deskbox import Deskbox
from deskbox.gym import DeskboxEnv
from deskbox.tasks.start import StartStates

from .conftest import TASKS_DIR, example, live_sessions, solver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

RESETS = 20


def test_twenty_resets_give_the_same_first_observation(box: Deskbox) -> None:
    before = live_sessions(box)
    env = DeskboxEnv(client=box, task=TASKS_DIR / "click-button.yaml", pool=2)
    try:
        first, info = env.reset(seed=0)
        sessions = {info["session_id"]}
        [snapshot] = box.snapshots.list()
        for n in range(RESETS):
            if n == 3:  # an episode that changes the page: its change does not carry over
                _, reward, terminated, _, _ = env.step(solver("solve")(first, info["instruction"]))
                assert (reward, terminated) == (1.0, True)
            observation, info = env.reset(seed=n + 1)
            assert info["settled"] and info["session_id"] not in sessions
            sessions.add(info["session_id"])
            differs = np.argwhere((observation != first).any(axis=2))
            assert len(differs) == 0, f"reset {n + 1}: {len(differs)} pixels differ, e.g. " \
                f"at (x, y) {differs[0][::-1].tolist()}"
            _, reward, *_ = env.step([{"type": "wait", "ms": 0}])
            assert reward == 0.0  # the start state again: nothing chosen
        assert box.snapshots.get(snapshot.id).raw["pool"]["size"] == 2
    finally:
        env.close()
    assert box.snapshots.list() == [] and live_sessions(box) == before


def test_a_pooled_reset_is_a_claim_of_a_ready_copy(box: Deskbox) -> None:
    """With a copy ready, a reset is tens of milliseconds, not a desktop's start (a bound
    ten times above what it takes here, so that only a cold start fails it)."""
    task = example("navigate-link")
    states = StartStates(box, pool=1)
    env = DeskboxEnv(client=box, task=task, start_states=states)
    try:
        env.reset()
        [snapshot] = box.snapshots.list()
        deadline = time.monotonic() + 60
        while box.snapshots.get(snapshot.id).raw["pool"]["ready"] < 1:
            assert time.monotonic() < deadline, "the pool made no copy in 60 s"
            time.sleep(0.1)
        started = time.monotonic()
        observation, info = env.reset()
        took = time.monotonic() - started
        assert info["settled"] and took < 0.5, f"a pooled reset took {took:.2f} s"
        _, reward, terminated, *_ = env.step(solver("solve")(observation, task.instruction))
        assert (reward, terminated) == (1.0, True)  # the copy works as the original did
    finally:
        env.close()
        states.close()
    assert box.snapshots.list() == []


def test_a_pool_needs_a_task(box: Deskbox) -> None:
    with pytest.raises(ValueError, match="give a task"):
        DeskboxEnv(client=box, pool=2)
    with pytest.raises(ValueError, match="pool must be 0 to 4"):
        StartStates(box, pool=9)
