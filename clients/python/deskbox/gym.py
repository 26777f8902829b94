"""Gymnasium environments on Deskbox desktops (``pip install 'deskbox[gym]'``).

::

    import gymnasium as gym
    import deskbox.gym  # registers deskbox/Desktop-v0

    env = gym.make("deskbox/Desktop-v0", start_url="https://example.org",
                   observation_size=(1024, 640), max_steps=50)
    obs, info = env.reset(seed=0)          # a new desktop; obs: uint8 (640, 1024, 3)
    obs, reward, terminated, truncated, info = env.step(
        {"type": "click", "x": 500, "y": 300})   # coordinates in observation pixels
    env.close()                            # deletes every session the env made

An observation is the settled screen as an RGB array at the model's size (the session's
coordinate space: the server maps coordinates and shrinks screenshots to it). An action is
one API action (a dict, API.md "Actions") or a list of them (a batch; NumPy numbers in it
are taken as numbers); the server checks it,
and one it refuses leaves the desktop as it was, with the refusal in ``info["error"]``. The
reward comes from ``evaluate(session)`` (run outside the model's view, after each step):
1.0 or more terminates the episode; ``max_steps`` truncates it. Each ``reset`` starts a new
session (from ``snapshot`` if given: the server's snapshot pool makes that a claim of a
ready copy) and deletes the previous one.

With a ``task`` (``deskbox.tasks``: a :class:`~deskbox.tasks.Task` or a task file's path),
``reset`` also runs the task's setup and puts its instruction in ``info["instruction"]``;
the task's evaluator gives the reward (its finding in ``info["evaluation"]``) and its
limits set ``max_steps`` and the episode's wall-clock bound. The model's own tool calls
are actions too: ``anthropic_action(tool_input)`` and ``openai_action(action)`` wrap them,
and the server translates them as its vendor endpoints do (API.md "Vendor dialects").
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, SupportsFloat, TypeGuard

import gymnasium
import numpy as np
from gymnasium import spaces
from numpy.typing import NDArray
from PIL import Image

from ._errors import UnprocessableEntity
from ._sync import Deskbox, Session
from .tasks import Task, evaluate
from .tasks.start import StartStates, task_desktop

__all__ = ["ACTION_TYPES", "DIALECTS", "ENV_ID", "LOOK_AFTER_CHANGES", "NOTHING",
           "RESET_SETTLE_S", "ActionSpace", "DeskboxEnv", "Episodes", "Observation",
           "anthropic_action", "as_batch", "is_tool_call", "openai_action", "pixels", "plain",
           "register", "task_of"]

ENV_ID = "deskbox/Desktop-v0"
# API.md "Actions": the types a step may send.
ACTION_TYPES = frozenset({
    "screenshot", "click", "move", "mouse_down", "mouse_up", "drag", "scroll", "type", "key",
    "hold_key", "wait", "cursor_position", "screen_size", "zoom", "clipboard_get",
    "clipboard_set",
})
# A vendor's tool call as one action: {"type": "anthropic", "input": {...}} (the input of
# Anthropic's computer tool) or {"type": "openai", "action": {...}} (a computer_call's).
DIALECTS = frozenset({"anthropic", "openai"})
Observation = NDArray[np.uint8]
Action = Mapping[str, Any] | Sequence[Mapping[str, Any]]
Evaluate = Callable[[Session], float]
_SAMPLE_KEYS = ("Escape", "Tab", "Down", "Up", "ctrl+a")


NOTHING: list[Mapping[str, Any]] = [{"type": "wait", "ms": 0}]  # observe without acting
# A look that waits a settle window of its own (100 ms of no change from now, API.md).
LOOK_AFTER_CHANGES: list[Mapping[str, Any]] = [{"type": "wait", "ms": 100}]
# How long reset() waits for the screen to settle (each observation waits up to 2 s).
RESET_SETTLE_S = 10.0


def anthropic_action(tool_input: Mapping[str, Any]) -> dict[str, Any]:
    """A step's action from the ``input`` of an Anthropic ``computer`` tool_use block."""
    return {"type": "anthropic", "input": dict(tool_input)}


def openai_action(action: Mapping[str, Any]) -> dict[str, Any]:
    """A step's action from an OpenAI ``computer_call``'s ``action``."""
    return {"type": "openai", "action": dict(action)}


def is_tool_call(action: Action) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``action`` is a vendor's tool call (``anthropic_action``, ``openai_action``):
    it goes to that vendor's endpoint, which translates it (API.md "Vendor dialects"); the
    plain actions endpoint refuses it."""
    return isinstance(action, Mapping) and action.get("type") in DIALECTS


@dataclass(frozen=True)
class Episodes:
    """What every episode of an env (single or vector) starts from, and when it ends."""

    display: tuple[int, int]
    size: tuple[int, int]  # the model's pixels
    start_url: str | None
    snapshot: str | None
    backend: str | None
    max_steps: int
    session_timeout_s: int
    render_mode: str | None
    #: An episode's wall-clock bound (a task's ``limits.timeout_s``): reaching it truncates.
    timeout_s: float | None = None

    @classmethod
    def of(cls, task: Task | None, display: tuple[int, int], size: tuple[int, int],
           start_url: str | None, snapshot: str | None, backend: str | None, max_steps: int,
           session_timeout_s: int, render_mode: str | None) -> Episodes:
        """An env's episodes; a task's limits and start snapshot win over the arguments."""
        timeout_s = None
        if task is not None:
            max_steps, timeout_s = task.limits.max_steps, task.limits.timeout_s
            snapshot = task.setup.snapshot or snapshot
        return cls(display, size, start_url, snapshot, backend, max_steps, session_timeout_s,
                   render_mode, timeout_s)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {self.render_mode!r}: only 'rgb_array' is offered")

    def observation_space(self) -> spaces.Box[np.uint8]:
        width, height = self.size
        return spaces.Box(0, 255, (height, width, 3), np.uint8)

    def action_space(self) -> ActionSpace:
        return ActionSpace(*self.size)

    def create_args(self) -> dict[str, Any]:
        """``sessions.create``'s arguments for a new episode's desktop."""
        width, height = self.display
        return {"display": {"width": width, "height": height}, "start_url": self.start_url,
                "from_snapshot": self.snapshot, "backend": self.backend,
                "coordinate_space": self.size, "timeout_s": self.session_timeout_s}

    def outcome(self, reward: float, steps: int, seconds: float = 0.0) -> tuple[bool, bool]:
        """(terminated, truncated): success ends an episode, ``max_steps`` or the episode's
        time cuts it."""
        terminated = reward >= 1.0
        out_of_time = self.timeout_s is not None and seconds >= self.timeout_s
        return terminated, not terminated and (steps >= self.max_steps or out_of_time)


def task_of(task: Task | str | Path | None, evaluate: bool, start_states: bool
            ) -> Task | None:
    """An env's task (loaded from its file if a path), checked against the env's other
    arguments: ``evaluate`` or ``start_states`` (a pool) given."""
    loaded = Task.load(task) if isinstance(task, str | Path) else task
    if loaded is not None and evaluate:
        raise ValueError("give a task or evaluate, not both: a task brings its evaluator")
    if start_states and loaded is None:
        raise ValueError("pool and start_states keep a task's start state: give a task")
    return loaded


def as_batch(action: Action) -> list[Mapping[str, Any]]:
    return [action] if isinstance(action, Mapping) else list(action)


def plain(action: Any) -> Any:
    """``action`` with NumPy numbers and arrays as Python's: a policy's coordinates are
    often NumPy's (an argmax is an ``np.int64``), which JSON cannot carry."""
    if isinstance(action, np.generic):
        return action.item()
    if isinstance(action, np.ndarray):
        return action.tolist()
    if isinstance(action, Mapping):
        return {key: plain(value) for key, value in action.items()}
    if isinstance(action, list | tuple):
        return [plain(value) for value in action]
    return action


def pixels(png: bytes, size: tuple[int, int]) -> Observation:
    """A screenshot as an RGB array of ``size`` (width, height), the caller's to change
    (``np.asarray`` of an image is a read-only view of its buffer)."""
    with Image.open(io.BytesIO(png)) as image:
        array = np.array(image.convert("RGB"), dtype=np.uint8)
    if array.shape[:2] != (size[1], size[0]):
        array = np.array(Image.fromarray(array).resize(size), dtype=np.uint8)
    return array


class ActionSpace(spaces.Space[Any]):
    """API actions in a screen of ``width`` × ``height`` (the model's pixels).

    ``contains`` checks an action's shape (a known type; ``x``/``y`` inside the screen); the
    server checks the rest. ``sample`` draws a pointer or key action, for random policies
    and Gymnasium's checker.
    """

    def __init__(self, width: int, height: int, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.width, self.height = width, height

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> dict[str, Any]:
        kind = self.np_random.choice(["move", "click", "scroll", "key"])
        x = int(self.np_random.integers(0, self.width))
        y = int(self.np_random.integers(0, self.height))
        if kind == "key":
            return {"type": "key", "keys": str(self.np_random.choice(_SAMPLE_KEYS))}
        if kind == "scroll":
            return {"type": "scroll", "x": x, "y": y, "dy": int(self.np_random.integers(-3, 4))}
        return {"type": str(kind), "x": x, "y": y}

    def contains(self, x: Any) -> bool:
        actions = [x] if isinstance(x, Mapping) else x
        if not isinstance(actions, Sequence) or isinstance(actions, str) or not actions:
            return False
        if isinstance(x, Mapping) and x.get("type") in DIALECTS:
            return isinstance(x.get("input" if x["type"] == "anthropic" else "action"), Mapping)
        for action in actions:
            if not isinstance(action, Mapping) or action.get("type") not in ACTION_TYPES:
                return False
            for key, bound in (("x", self.width), ("y", self.height)):
                value = action.get(key)
                if value is not None and not (isinstance(value, int | np.integer)
                                              and 0 <= value < bound):
                    return False
        return True

    def __repr__(self) -> str:
        return f"ActionSpace({self.width}x{self.height})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ActionSpace)
                and (other.width, other.height) == (self.width, self.height))


class DeskboxEnv(gymnasium.Env[Observation, Any]):
    """One desktop per episode; see the module's documentation.

    ``client``: a :class:`deskbox.Deskbox` to use (else one from ``base_url``/``api_key``,
    or ``DESKBOX_URL``/``DESKBOX_API_KEY``, closed with the env). ``display``: the screen's
    size; ``observation_size``: the model's (default: the screen's). ``task``: a
    :class:`~deskbox.tasks.Task` or a task file; its limits win over ``max_steps``, and it
    cannot be given with ``evaluate``. ``pool``: reset from a snapshot of the task's start
    state, with that many restored copies kept ready (1–4; engines with checkpoints), or
    ``start_states``: a :class:`~deskbox.tasks.start.StartStates` shared with other envs.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        client: Deskbox | None = None,
        display: tuple[int, int] = (1280, 800),
        observation_size: tuple[int, int] | None = None,
        start_url: str | None = None,
        snapshot: str | None = None,
        backend: str | None = None,
        max_steps: int = 100,
        evaluate: Evaluate | None = None,
        task: Task | str | Path | None = None,
        pool: int = 0,
        start_states: StartStates | None = None,
        render_mode: str | None = "rgb_array",
        session_timeout_s: int = 900,
    ) -> None:
        self.task = task_of(task, evaluate is not None, pool > 0 or start_states is not None)
        self.episodes = Episodes.of(self.task, display, observation_size or display, start_url,
                                    snapshot, backend, max_steps, session_timeout_s, render_mode)
        self._owns_client = client is None
        self.client = client if client is not None else Deskbox(base_url, api_key)
        self.observation_space = self.episodes.observation_space()
        self.action_space = self.episodes.action_space()
        self.render_mode = render_mode
        self.evaluate = evaluate
        self._owns_start_states = start_states is None and pool > 0
        self.start_states = (StartStates(self.client, pool) if self._owns_start_states
                             else start_states)
        self.session: Session | None = None
        self.steps = 0
        self._started = 0.0
        self._last: Observation | None = None

    # -- the Gymnasium interface ----------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Observation, dict[str, Any]]:
        super().reset(seed=seed)
        self._end_session()
        self.steps = 0
        changed_just_now = True
        if self.task is not None:
            self.session, changed_just_now = task_desktop(
                self.client, self.task, self.episodes.create_args(), self.start_states)
        else:
            self.session = self.client.sessions.create(**self.episodes.create_args())
        info: dict[str, Any] = {"session_id": self.session.id}
        if self.task is not None:
            info["instruction"] = self.task.instruction
        # The first observation is of a settled screen: a page still loading or laying out
        # (on a busy host, longer than one settle bound) would show the model, and the
        # next reset, a different start.
        # A desktop set up just now may still be drawing what the setup did: the first look
        # waits out a quiet window of its own (a batch of only a `wait 0` would count the
        # quiet before it). A copy of a start state has been still since its restore.
        deadline = time.monotonic() + RESET_SETTLE_S
        observation, info["settled"] = self._observe(LOOK_AFTER_CHANGES if changed_just_now
                                                     else NOTHING)
        while not info["settled"] and time.monotonic() < deadline:
            observation, info["settled"] = self._observe(NOTHING)
        self._started = time.monotonic()
        return observation, info

    def step(self, action: Action) -> tuple[Observation, SupportsFloat, bool, bool,
                                            dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("step() before reset()")
        action = plain(action)
        self.steps += 1
        # Nothing episode-specific (the session's id is reset()'s): the same action after the
        # same reset gives the same info (Gymnasium's determinism check).
        info: dict[str, Any] = {"steps": self.steps}
        try:
            if is_tool_call(action):
                self._act_in_dialect(action)
                action = NOTHING
            observation, info["settled"] = self._observe(as_batch(action))
        except UnprocessableEntity as refused:
            # The model's mistake, not the environment's: the desktop is as it was.
            info["error"] = str(refused)
            observation, info["settled"] = self._observe(NOTHING)
        reward = self._reward(info)
        outcome = self.episodes.outcome(reward, self.steps, time.monotonic() - self._started)
        return observation, reward, *outcome, info

    def render(self) -> Observation | None:
        if self.render_mode is None:
            return None
        if self._last is None:
            raise RuntimeError("render() before reset()")
        return self._last.copy()

    def close(self) -> None:
        try:
            self._end_session()
        finally:
            try:
                if self._owns_start_states and self.start_states is not None:
                    self.start_states.close()
            finally:
                if self._owns_client:
                    self.client.close()
        super().close()

    # -- parts ----------------------------------------------------------------------------

    def _observe(self, actions: list[Mapping[str, Any]]) -> tuple[Observation, bool]:
        assert self.session is not None
        size = self.episodes.size
        result = self.session.act(actions, screenshot={"format": "png"}, coordinate_space=size)
        assert result.screenshot is not None
        self._last = pixels(result.screenshot.data, size)
        # The caller's copy: what it changes in place is not what render() shows.
        return self._last.copy(), result.settled

    def _act_in_dialect(self, action: Mapping[str, Any]) -> None:
        assert self.session is not None
        size = self.episodes.size
        if action["type"] == "anthropic":
            self.session.act_anthropic(action["input"], coordinate_space=size)
        else:
            self.session.act_openai(action["action"], coordinate_space=size)

    def _reward(self, info: dict[str, Any]) -> float:
        assert self.session is not None
        if self.task is not None:
            evaluation = evaluate(self.session, self.task)
            info["evaluation"] = evaluation.detail
            return evaluation.reward
        return float(self.evaluate(self.session)) if self.evaluate is not None else 0.0

    def _end_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            session.close()


def register() -> None:
    """Make ``gymnasium.make(ENV_ID, ...)`` build a :class:`DeskboxEnv` (idempotent; done
    when this module is imported, as Gymnasium's own environments are)."""
    if ENV_ID not in gymnasium.registry:
        # nondeterministic: a fresh desktop's browser is not pixel-exact from one seeded
        # reset to the next (its toolbar's icons have been seen a shade apart); a reset from
        # a start state (snapshot) is, and tests/tasks/test_reset_from_snapshots.py says so.
        gymnasium.register(id=ENV_ID, entry_point="deskbox.gym:DeskboxEnv",
                           vector_entry_point="deskbox.gym_vector:DeskboxVectorEnv",
                           nondeterministic=True)


register()
