"""``deskbox.gym``: the Gymnasium environments against a real server (the local backend's
desktops: Xvfb and Chromium): Gymnasium's own checker passes; ``gymnasium.make`` builds it;
observations are the settled screen at the model's size; a click that turns the page green
is rewarded by an evaluator and ends the episode; a refused action is reported, not
raised; ``max_steps`` truncates; ``close`` deletes every session the env made. The vector
env steps two desktops at once and resets an ended one at the next step, takes vendor tool
calls as the single env does, and a reset refused part-way deletes the sessions it started.
"""

from __future__ import annotations

import urllib.parse
import warnings
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from deskbox import APIConnectionError, AsyncSession, Deskbox, DeskboxError, RateLimited, Session
from deskbox.gym import ACTION_TYPES, ENV_ID, DeskboxEnv, anthropic_action, openai_action
from deskbox.gym_vector import DeskboxVectorEnv
from deskbox.tasks import Task
from deskbox_server.schemas.actions import ActionAdapter
from deskbox_server.settings import Settings

from ..api.conftest import running_server
from .conftest import KEY_A, Server

pytestmark = pytest.mark.timeout(180)

SIZE = (640, 400)  # the model's pixels; the screen is 1280x800
PAGE = "data:text/html," + urllib.parse.quote(
    "<body style='margin:0;background:#c00000' "
    "onclick=\"document.body.style.background='#00c000'\"></body>")


def green(session: Session) -> float:
    """The evaluator: 1.0 once the page is green (read from the screen, outside the
    model's view)."""
    image = session.screenshot(format="png", as_image=True).convert("RGB")
    r, g, _ = np.asarray(image)[image.height // 2, image.width // 2]
    return 1.0 if g > 150 and r < 80 else 0.0


def my_sessions(server: Server) -> list[str]:
    """This key's sessions that still run (stopped ones stay listed)."""
    with Deskbox(server.url, KEY_A) as box:
        return [s.id for s in box.sessions.list() if s.state not in ("stopped", "failed")]


def test_gymnasiums_checker_passes(local_server: Server) -> None:
    # A page of its own: on about:blank Chromium's address bar has the focus, and its caret
    # blinks. The env is registered nondeterministic (a fresh browser's toolbar was seen a
    # shade apart between two seeded resets): the checker skips comparing resets; resets
    # from a start state are compared pixel by pixel in tests/tasks/.
    env = gymnasium.make(ENV_ID, base_url=local_server.url, api_key=KEY_A,
                         observation_size=SIZE, max_steps=5, start_url=PAGE)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=False)
        assert [str(w.message) for w in caught] == []
    finally:
        env.close()
    assert my_sessions(local_server) == []


def test_an_episode_through_gymnasium_make(local_server: Server) -> None:
    env = gymnasium.make(ENV_ID, base_url=local_server.url, api_key=KEY_A, start_url=PAGE,
                         observation_size=SIZE, evaluate=green, max_steps=3)
    try:
        obs, info = env.reset(seed=1)
        assert obs.shape == (400, 640, 3) and obs.dtype == np.uint8
        assert tuple(obs[200, 320]) == (0xC0, 0, 0)  # red: the page, at the model's size
        # The caller's to change in place (a normalization, a mask): it was read-only,
        # PIL's buffer, and torch.from_numpy warned that it was not writable.
        assert obs.flags.writeable
        assert info["session_id"] in my_sessions(local_server)
        first = info["session_id"]
        # A refused action changes nothing and ends nothing: the model gets the reason.
        obs, reward, terminated, truncated, info = env.step({"type": "click", "x": -5, "y": 1})
        assert "x" in info["error"] and (reward, terminated, truncated) == (0.0, False, False)
        # Coordinates are the model's: (320, 200) is the screen's middle. A policy's NumPy
        # numbers (an argmax) are numbers: they were a TypeError (not JSON serializable).
        click = {"type": "click", "x": np.int64(320), "y": np.array([200])[0]}
        assert env.action_space.contains(click)
        obs, reward, terminated, truncated, info = env.step(click)
        assert tuple(obs[200, 320]) == (0, 0xC0, 0) and "error" not in info
        assert (reward, terminated, truncated) == (1.0, True, False)
        np.testing.assert_array_equal(env.render(), obs)
        obs[200, 320] = 0
        assert obs.flags.writeable and tuple(env.render()[200, 320]) == (0, 0xC0, 0)
        # A new episode is a new desktop; the old one is gone.
        obs, info = env.reset()
        assert info["session_id"] != first and tuple(obs[200, 320]) == (0xC0, 0, 0)
        assert my_sessions(local_server) == [info["session_id"]]
        for _ in range(3):
            *_, terminated, truncated, _ = env.step({"type": "move", "x": 10, "y": 10})
        assert (terminated, truncated) == (False, True)  # max_steps
    finally:
        env.close()
    assert my_sessions(local_server) == []


def test_vendor_tool_calls_are_actions(local_server: Server) -> None:
    """A model's own tool call is one action: the server translates it in the model's
    coordinates, as its vendor endpoints do, and the step observes the result."""
    env = DeskboxEnv(local_server.url, KEY_A, start_url=PAGE, observation_size=SIZE,
                     evaluate=green, max_steps=5)
    try:
        env.reset()
        clicks = [anthropic_action({"action": "left_click", "coordinate": [320, 200]}),
                  openai_action({"type": "click", "button": "left", "x": 320, "y": 200})]
        for click in clicks:
            assert env.action_space.contains(click)
            obs, reward, terminated, _, info = env.step(click)
            assert tuple(obs[200, 320]) == (0, 0xC0, 0) and (reward, terminated) == (1.0, True)
            env.reset()
        # A call the server refuses is reported like a refused action.
        obs, reward, terminated, _, info = env.step(
            anthropic_action({"action": "left_click", "coordinate": [-4, 2]}))
        assert "coordinate" in info["error"] and tuple(obs[200, 320]) == (0xC0, 0, 0)
        assert not env.action_space.contains({"type": "anthropic", "input": "click"})
    finally:
        env.close()


def test_the_action_space_is_the_apis(local_server: Server) -> None:
    assert set(ActionAdapter.json_schema()["discriminator"]["mapping"]) == ACTION_TYPES
    env = DeskboxEnv(local_server.url, KEY_A, observation_size=SIZE)
    try:
        space = env.action_space
        space.seed(0)
        samples = [space.sample() for _ in range(50)]
        for action in samples:  # each one the server's schema accepts, in the model's screen
            assert space.contains(action)
            ActionAdapter.validate_python(action)
        assert not space.contains({"type": "click", "x": 640, "y": 0})
        assert not space.contains({"type": "teleport"}) and not space.contains([])
        assert space.contains([{"type": "key", "keys": "a"}, {"type": "wait", "ms": 5}])
    finally:
        env.close()


async def green_async(session: AsyncSession) -> float:
    image = (await session.screenshot(format="png", as_image=True)).convert("RGB")
    r, g, _ = np.asarray(image)[image.height // 2, image.width // 2]
    return 1.0 if g > 150 and r < 80 else 0.0


def test_a_vector_env_steps_its_desktops_together_and_autoresets(local_server: Server) -> None:
    envs = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point",
                              base_url=local_server.url, api_key=KEY_A, start_url=PAGE,
                              observation_size=SIZE, evaluate=green_async, max_steps=5)
    try:
        assert isinstance(envs, DeskboxVectorEnv)
        obs, infos = envs.reset(seed=3)
        assert obs.shape == (2, 400, 640, 3) and obs.dtype == np.uint8
        first = list(infos["session_id"])
        assert sorted(my_sessions(local_server)) == sorted(first)
        # The first desktop's click ends its episode; the second only moves.
        obs, rewards, terminated, truncated, infos = envs.step([
            {"type": "click", "x": np.int64(320), "y": 200}, {"type": "move", "x": 1, "y": 1}])
        assert list(rewards) == [1.0, 0.0] and list(terminated) == [True, False]
        assert tuple(obs[0, 200, 320]) == (0, 0xC0, 0) and tuple(obs[1, 200, 320]) == (0xC0, 0, 0)
        # The caller's frames, as the single env's: the next step does not write over them.
        rendered = envs.render()
        assert rendered is not None and all(frame.flags.owndata for frame in rendered)
        # Next step: the first is reset (a new session, red again; its action not taken).
        obs, rewards, terminated, truncated, infos = envs.step([
            {"type": "click", "x": 320, "y": 200}, {"type": "move", "x": 2, "y": 2}])
        assert list(rewards) == [0.0, 0.0] and not terminated.any()
        assert infos["_session_id"][0] and not infos["_session_id"][1]
        assert infos["session_id"][0] not in first
        assert tuple(obs[0, 200, 320]) == (0xC0, 0, 0)
        assert sorted(my_sessions(local_server)) == sorted([infos["session_id"][0], first[1]])
    finally:
        envs.close()
    assert my_sessions(local_server) == []


def test_a_failed_step_closes_the_vector_env_and_deletes_every_session(
    local_server: Server
) -> None:
    envs = DeskboxVectorEnv(3, local_server.url, KEY_A, start_url=PAGE, observation_size=SIZE)
    _, infos = envs.reset()
    with Deskbox(local_server.url, KEY_A) as box:  # one desktop deleted behind its back
        box.sessions.delete(infos["session_id"][1])
    with pytest.raises(DeskboxError):
        envs.step([{"type": "move", "x": 1, "y": 1}] * 3)
    assert my_sessions(local_server) == []
    envs.close()  # again: nothing left to do


def test_a_vector_env_that_cannot_delete_its_sessions_says_which(
    tmp_path: Path,
) -> None:
    """close() returned as if all were well, its sessions left running, and had forgotten
    them before their deletes failed."""
    settings = Settings(state_dir=tmp_path, api_keys=[KEY_A], backends=["local"],
                        default_backend="local")
    with running_server(settings) as server:
        envs = DeskboxVectorEnv(2, server.url, KEY_A, start_url=PAGE, observation_size=SIZE)
        _, infos = envs.reset()
    # The server has stopped (its desktops with it): no delete reaches it.
    with pytest.raises(DeskboxError, match="could not delete") as raised:
        envs.close()
    assert all(session_id in str(raised.value) for session_id in infos["session_id"])
    assert isinstance(raised.value.__cause__, APIConnectionError)


def test_a_vector_env_takes_vendor_tool_calls_as_the_single_env_does(
    local_server: Server
) -> None:
    """An Anthropic and an OpenAI click in the model's coordinates turn both pages green;
    a call the server refuses is reported in that environment's info, not raised."""
    envs = DeskboxVectorEnv(2, local_server.url, KEY_A, start_url=PAGE, observation_size=SIZE,
                            evaluate=green_async, max_steps=5)
    try:
        envs.reset()
        obs, rewards, terminated, _, infos = envs.step([
            anthropic_action({"action": "left_click", "coordinate": [320, 200]}),
            openai_action({"type": "click", "button": "left", "x": 320, "y": 200})])
        assert "error" not in infos
        assert [tuple(o[200, 320]) for o in obs] == [(0, 0xC0, 0)] * 2
        assert list(rewards) == [1.0, 1.0] and list(terminated) == [True, True]
        obs, *_ = envs.step([[{"type": "wait", "ms": 0}]] * 2)  # both reset: red again
        obs, rewards, _, _, infos = envs.step([
            anthropic_action({"action": "left_click", "coordinate": [-4, 2]}),
            openai_action({"type": "move", "x": 1, "y": 1})])
        assert "coordinate" in infos["error"][0] and not infos["_error"][1]
        assert [tuple(o[200, 320]) for o in obs] == [(0xC0, 0, 0)] * 2
    finally:
        envs.close()
    assert my_sessions(local_server) == []


# A task with no setup: its desktops are plain new ones, made on the env's worker threads.
NOTHING_TO_DO = Task.model_validate({"id": "nothing", "instruction": "Look at the page.",
                                     "evaluator": {"type": "url", "pattern": "^data:"}})


@pytest.mark.parametrize("task", [None, NOTHING_TO_DO], ids=["plain", "task"])
def test_a_reset_refused_part_way_deletes_the_sessions_it_started(
    one_per_key: Server, task: Task | None
) -> None:
    """The key may hold one session: of the two creates of a reset, one is refused at once
    while the other's desktop is still starting. The reset raises the refusal, and the
    session that did start is deleted once its create ends, not left running unseen."""
    envs = DeskboxVectorEnv(2, one_per_key.url, KEY_A, start_url=PAGE, observation_size=SIZE,
                            task=task)
    try:
        with pytest.raises(RateLimited, match="maximum of 1 live sessions") as refused:
            envs.reset()
        assert my_sessions(one_per_key) == []
        [note] = refused.value.__notes__  # under the refusal in its traceback
        assert note.startswith("in environment ") and "the vector env is closed" in note
    finally:
        envs.close()
        with Deskbox(one_per_key.url, KEY_A) as box:  # a leak must not fail the next test
            for session in box.sessions.list():
                session.close()
