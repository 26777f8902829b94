"""Resets from a task's start state kept as a snapshot (``pool``): the first reset sets the
task up and snapshots it; the others are copies of it, claimed from the snapshot's pool or
restored. 20 resets show the same first observation, pixel for pixel; what an episode did
is gone at the next reset; closing deletes the snapshot and its copies, every one it can
and then names those it could not. A pool past the key's cap is refused with nothing left
behind. The vector env does the same for N envs at once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from deskbox import Deskbox, DeskboxError, UnprocessableEntity
from deskbox.gym import DeskboxEnv
from deskbox.gym_vector import DeskboxVectorEnv
from deskbox.tasks.start import StartStates

from ..api.conftest import KEY_A, Server
from ..api.containers import container_server
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
        _, reward, terminated, _, info = env.step(solver("solve")(observation, task.instruction))
        # The copy works as the original did. A settled screen is one that stopped changing
        # (docs/API.md): a navigation that has not painted yet on a busy host reaches the
        # evaluator a step later, as it would an agent's.
        for _ in range(10):
            if terminated:
                break
            _, reward, terminated, _, info = env.step([{"type": "wait", "ms": 300}])
        assert (reward, terminated) == (1.0, True), info
    finally:
        env.close()
        states.close()
    assert box.snapshots.list() == []


def test_closing_tries_every_delete_and_names_the_snapshots_it_could_not(box: Deskbox) -> None:
    """The first of two start states' snapshots is deleted behind their back: closing still
    deletes the second, then raises an error naming the first."""
    before = {s.id for s in box.snapshots.list()}
    states = StartStates(box, pool=0)  # no copies: only the snapshots matter here
    made: list[str] = []
    try:
        for name in ("click-button", "navigate-link"):
            session, _ = states.desktop(example(name), {"display": {"width": 1280,
                                                                    "height": 800}})
            session.close()
            [snapshot] = {s.id for s in box.snapshots.list()} - before - set(made)
            made.append(snapshot)
        box.snapshots.delete(made[0])
        with pytest.raises(DeskboxError) as failed:
            states.close()
        assert {s.id for s in box.snapshots.list()} == before  # the second went all the same
        assert str(failed.value).startswith("1 of 2 start states' snapshots could not be "
                                            f"deleted ({made[0]}: 404 not_found")
    finally:
        for snapshot in {s.id for s in box.snapshots.list()} - before:
            box.snapshots.delete(snapshot)


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deskbox]:
    """A server whose key may run 2 sessions, so its snapshots' pools may keep 2 copies."""
    with container_server(tmp_path_factory, "capped", max_sessions_per_key=2) as server, \
            Deskbox(server.url, KEY_A) as client:
        yield client


def test_a_pool_past_the_keys_cap_leaves_nothing_behind(capped: Deskbox) -> None:
    """A pool of 3 is refused: the reset raises the refusal, and neither the desktop set up
    for it nor its snapshot is left. The next reset is refused again, not started from a
    snapshot without its pool."""
    states = StartStates(capped, pool=3)  # as `deskbox eval --pool 3` makes it
    env = DeskboxEnv(client=capped, task=example("click-button"), start_states=states)
    try:
        for _ in range(2):
            with pytest.raises(UnprocessableEntity, match="may keep 2 copies in all"):
                env.reset()
            assert capped.snapshots.list() == [] and live_sessions(capped) == []
    finally:
        env.close()
        states.close()


def test_a_pool_needs_a_task(box: Deskbox) -> None:
    with pytest.raises(ValueError, match="give a task"):
        DeskboxEnv(client=box, pool=2)
    with pytest.raises(ValueError, match="pool must be 0 to 4"):
        StartStates(box, pool=9)


def test_a_vector_env_runs_a_task_from_its_start_state(task_server: Server) -> None:
    """Two envs on the task's start state: one solves it (reward 1, the evaluator's finding
    in its info), the other does nothing (0); the solved one's next step resets it to the
    same start, a copy from the pool; closing deletes the sessions and the snapshot."""
    with Deskbox(task_server.url, KEY_A) as box:
        before = live_sessions(box)
        task = example("click-button")
        envs = DeskboxVectorEnv(2, task_server.url, KEY_A, task=task, pool=1)
        try:
            first, infos = envs.reset(seed=0)
            assert list(infos["instruction"]) == [task.instruction] * 2
            assert infos["settled"].all()
            assert not (first[0] != first[1]).any(), "the two start states differ"
            solve = solver("solve")(first[0], task.instruction)
            _, rewards, terminated, truncated, infos = envs.step(
                [solve, [{"type": "wait", "ms": 0}]])
            assert rewards.tolist() == [1.0, 0.0]
            assert terminated.tolist() == [True, False] and not truncated.any()
            assert all(isinstance(detail, str) and detail for detail in infos["evaluation"])
            again, rewards, terminated, _, infos = envs.step(
                [[{"type": "wait", "ms": 0}]] * 2)  # env 0 resets: its action is not taken
            assert infos["session_id"][0] and rewards.tolist() == [0.0, 0.0]
            assert not (again[0] != first[0]).any(), "the reset did not give the start again"
            assert len(box.snapshots.list()) == 1
        finally:
            envs.close()
        assert box.snapshots.list() == [] and live_sessions(box) == before


def test_a_vector_env_refuses_a_pool_without_a_task() -> None:
    with pytest.raises(ValueError, match="give a task"):
        DeskboxVectorEnv(2, "http://127.0.0.1:9", KEY_A, pool=1)
