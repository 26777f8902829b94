"""``DeskboxVectorEnv``: N desktops stepped together, one event loop for all of them.

::

    envs = gymnasium.make_vec("deskbox/Desktop-v0", num_envs=8,
                              vectorization_mode="vector_entry_point", start_url=...)
    obs, infos = envs.reset(seed=0)        # uint8 (8, H, W, 3)
    obs, rewards, terminated, truncated, infos = envs.step([action] * 8)

The environments' requests go out at once through the async client (no thread per env):
a step costs about one step of the slowest environment, not the sum. Autoreset is
Gymnasium's next-step mode: the step after an episode ended resets that environment (a new
session) and ignores its action. ``evaluate`` is awaited with the session
(:class:`deskbox.AsyncSession`). ``close`` deletes every session, also after an error or a
KeyboardInterrupt in a step or a reset: the sessions still starting then are waited for and
deleted too (a reset with one create refused leaves none of the others running). A session
it could not delete (the server unreachable) is named in the DeskboxError it then raises.

With a ``task`` (as :class:`deskbox.gym.DeskboxEnv` takes it), each reset runs the task's
setup, or with ``pool``/``start_states`` claims or restores a copy of its start state, and
the task's evaluator gives the rewards. Those parts are the task package's blocking calls:
they run on worker threads while the loop steps the other environments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from numpy.typing import NDArray

from ._async import AsyncDeskbox, AsyncSession
from ._errors import DeskboxError, UnprocessableEntity
from ._sync import Deskbox, Session
from .gym import (
    LOOK_AFTER_CHANGES,
    NOTHING,
    RESET_SETTLE_S,
    Episodes,
    Observation,
    as_batch,
    is_tool_call,
    pixels,
    plain,
    task_of,
)
from .tasks import Task, evaluate
from .tasks.start import StartStates, task_desktop

__all__ = ["AsyncEvaluate", "DeskboxVectorEnv"]

AsyncEvaluate = Callable[[AsyncSession], Awaitable[float]]


class DeskboxVectorEnv(VectorEnv[NDArray[np.uint8], Any, NDArray[Any]]):
    metadata = {"render_modes": ["rgb_array"], "autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(
        self,
        num_envs: int,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        display: tuple[int, int] = (1280, 800),
        observation_size: tuple[int, int] | None = None,
        start_url: str | None = None,
        snapshot: str | None = None,
        backend: str | None = None,
        max_steps: int = 100,
        evaluate: AsyncEvaluate | None = None,
        task: Task | str | Path | None = None,
        pool: int = 0,
        start_states: StartStates | None = None,
        render_mode: str | None = "rgb_array",
        session_timeout_s: int = 900,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1")
        self.task = task_of(task, evaluate is not None, pool > 0 or start_states is not None)
        self.episodes = Episodes.of(self.task, display, observation_size or display, start_url,
                                    snapshot, backend, max_steps, session_timeout_s, render_mode)
        self.num_envs = num_envs
        self.single_observation_space = self.episodes.observation_space()
        self.single_action_space = self.episodes.action_space()
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = render_mode
        self.evaluate = evaluate
        width, height = self.episodes.size
        self._loop = asyncio.new_event_loop()
        self._client = AsyncDeskbox(base_url, api_key)
        # The task package's calls are blocking ones: a client of their own, on threads.
        self._task_client = Deskbox(base_url, api_key) if self.task is not None else None
        self._owns_start_states = start_states is None and pool > 0
        self.start_states = (StartStates(self._task_client, pool)
                             if self._task_client is not None and self._owns_start_states
                             else start_states)
        self._sessions: list[AsyncSession | None] = [None] * num_envs
        self._starting: set[asyncio.Future[tuple[AsyncSession, bool]]] = set()
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._started = np.zeros(num_envs, dtype=np.float64)  # each episode's monotonic start
        self._ended = np.zeros(num_envs, dtype=bool)  # reset at the next step (autoreset)
        self._last = np.zeros((num_envs, height, width, 3), dtype=np.uint8)
        self._closed = False

    # -- the Gymnasium interface ----------------------------------------------------------

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None
              ) -> tuple[NDArray[np.uint8], dict[str, Any]]:
        super().reset(seed=seed)
        self._steps[:] = 0
        self._ended[:] = False
        results = self._run(*(self._reset_one(i) for i in range(self.num_envs)))
        infos: dict[str, Any] = {}
        for i, (observation, info) in enumerate(results):
            self._last[i] = observation
            infos = self._add_info(infos, info, i)
        return self._last.copy(), infos

    def step(self, actions: Sequence[Any]
             ) -> tuple[NDArray[np.uint8], NDArray[np.float64], NDArray[np.bool_],
                        NDArray[np.bool_], dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} environments")
        if any(session is None for session in self._sessions):
            raise RuntimeError("step() before reset()")
        results = self._run(*(self._step_one(i, action) for i, action in enumerate(actions)))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        for i, (observation, reward, term, trunc, info) in enumerate(results):
            self._last[i] = observation
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            infos = self._add_info(infos, info, i)
        self._ended = terminated | truncated
        return self._last.copy(), rewards, terminated, truncated, infos

    def render(self) -> tuple[NDArray[np.uint8], ...] | None:
        # Copies, as the single env's: the next step writes over the views of _last.
        return None if self.render_mode is None else tuple(frame.copy() for frame in self._last)

    def close_extras(self, **kwargs: Any) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # What an interrupt left running on the loop stops first.
            self._loop.run_until_complete(self._stop_pending())
            try:
                self._loop.run_until_complete(self._delete_all())
            finally:
                self._loop.run_until_complete(self._client.close())
        finally:
            self._loop.close()
            try:
                if self._owns_start_states and self.start_states is not None:
                    self.start_states.close()
            finally:
                if self._task_client is not None:
                    self._task_client.close()

    # -- one environment --------------------------------------------------------------------

    async def _reset_one(self, i: int) -> tuple[Observation, dict[str, Any]]:
        await self._delete(i)
        self._steps[i] = 0
        info: dict[str, Any] = {}
        session, changed_just_now = await self._start(i)
        if self.task is not None:
            info["instruction"] = self.task.instruction
        info["session_id"] = session.id
        # As DeskboxEnv.reset: the first observation is of a settled screen.
        deadline = time.monotonic() + RESET_SETTLE_S
        observation, info["settled"] = await self._observe(
            session, LOOK_AFTER_CHANGES if changed_just_now else NOTHING)
        while not info["settled"] and time.monotonic() < deadline:
            observation, info["settled"] = await self._observe(session, NOTHING)
        self._started[i] = time.monotonic()
        return observation, info

    async def _start(self, i: int) -> tuple[AsyncSession, bool]:
        """Environment ``i``'s new desktop, and whether it changed just now (as
        :func:`task_desktop`). A cancel stops the wait, not the start: the server makes the
        session whether or not its answer is read (a task's setup runs on in its thread), and
        only the answer says which session to delete. So the start goes on, ``_run`` waits
        for it, and the session it made is the environment's, deleted with the others."""
        start = asyncio.ensure_future(self._new_desktop(i))
        self._starting.add(start)
        start.add_done_callback(self._starting.discard)
        return await asyncio.shield(start)

    async def _new_desktop(self, i: int) -> tuple[AsyncSession, bool]:
        if self.task is not None:
            session, changed_just_now = await self._task_desktop()
        else:
            session = await self._client.sessions.create(**self.episodes.create_args())
            changed_just_now = True
        self._sessions[i] = session
        return session, changed_just_now

    async def _task_desktop(self) -> tuple[AsyncSession, bool]:
        assert self.task is not None and self._task_client is not None
        made, changed_just_now = await asyncio.to_thread(
            task_desktop, self._task_client, self.task, self.episodes.create_args(),
            self.start_states)
        return AsyncSession(self._client, made.data), changed_just_now

    async def _step_one(self, i: int, action: Any
                        ) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if self._ended[i]:  # next-step autoreset: this step's action is not taken
            observation, started = await self._reset_one(i)
            return observation, 0.0, False, False, started
        session = self._sessions[i]
        assert session is not None
        action = plain(action)
        self._steps[i] += 1
        info: dict[str, Any] = {"steps": int(self._steps[i])}
        try:
            if is_tool_call(action):  # as DeskboxEnv.step: through the vendor's endpoint
                await self._act_in_dialect(session, action)
                action = NOTHING
            observation, info["settled"] = await self._observe(session, as_batch(action))
        except UnprocessableEntity as refused:  # as DeskboxEnv.step: reported, not raised
            info["error"] = str(refused)
            observation, info["settled"] = await self._observe(session, NOTHING)
        reward = await self._reward(session, info)
        seconds = time.monotonic() - self._started[i]
        return observation, reward, *self.episodes.outcome(reward, int(self._steps[i]),
                                                           seconds), info

    async def _act_in_dialect(self, session: AsyncSession, action: Mapping[str, Any]) -> None:
        size = self.episodes.size
        if action["type"] == "anthropic":
            await session.act_anthropic(action["input"], coordinate_space=size)
        else:
            await session.act_openai(action["action"], coordinate_space=size)

    async def _reward(self, session: AsyncSession, info: dict[str, Any]) -> float:
        if self.task is not None:
            assert self._task_client is not None
            evaluation = await asyncio.to_thread(
                evaluate, Session(self._task_client, session.data), self.task)
            info["evaluation"] = evaluation.detail
            return evaluation.reward
        return float(await self.evaluate(session)) if self.evaluate is not None else 0.0

    async def _observe(self, session: AsyncSession, actions: Sequence[Mapping[str, Any]]
                       ) -> tuple[Observation, bool]:
        size = self.episodes.size
        result = await session.act(actions, screenshot={"format": "png"}, coordinate_space=size)
        assert result.screenshot is not None
        return pixels(result.screenshot.data, size), result.settled

    async def _delete(self, i: int) -> None:
        # The slot keeps a session whose delete failed, for close() to try again and name.
        session = self._sessions[i]
        if session is not None:
            await session.close()
            self._sessions[i] = None

    async def _stop_pending(self) -> None:
        others = asyncio.all_tasks() - {asyncio.current_task()} - self._starting
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._starts_ended()

    async def _starts_ended(self) -> None:
        """Every start under way has made its session, which the environment now holds,
        or failed."""
        await asyncio.gather(*list(self._starting), return_exceptions=True)

    async def _delete_all(self) -> None:
        """Delete every session, all tried even if some fail; then a DeskboxError naming
        those still running (as DeskboxEnv.close raises), not a silent return."""
        outcomes = await asyncio.gather(*(self._delete(i) for i in range(self.num_envs)),
                                        return_exceptions=True)
        failed = [(session.id, outcome) for session, outcome in zip(self._sessions, outcomes,
                                                                    strict=True)
                  if session is not None and isinstance(outcome, BaseException)]
        if failed:
            names = ", ".join(session_id for session_id, _ in failed)
            raise DeskboxError(
                f"could not delete session(s) {names}: {failed[0][1]}; they run until their "
                "idle timeout unless deleted") from failed[0][1]

    def _run(self, *calls: Coroutine[Any, Any, Any]) -> list[Any]:
        """The calls at once on the env's loop, one per environment, in order. On a failure
        the others are cancelled, the sessions they were starting are waited for, every
        session goes (the env is closed) and the first error is raised, with a note naming
        its environment; a KeyboardInterrupt closes the env too."""

        async def all_of() -> list[Any]:
            tasks = [asyncio.ensure_future(call) for call in calls]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = [i for i, t in enumerate(tasks)
                      if t.done() and not t.cancelled() and t.exception()]
            if failed:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await self._starts_ended()
                error = tasks[failed[0]].exception()
                assert error is not None
                error.add_note(f"in environment {failed[0]} of {self.num_envs}; the vector "
                               "env is closed and its sessions deleted, those that were "
                               "starting too")
                raise error
            return [task.result() for task in tasks]

        try:
            return self._loop.run_until_complete(all_of())
        except BaseException as error:
            try:
                self.close()
            except DeskboxError as not_deleted:  # the step's error is the one to raise
                error.add_note(str(not_deleted))
            raise
