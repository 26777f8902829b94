"""``deskbox eval``: an agent over tasks, N episodes at once, one JSONL line per episode.

An agent is a plain callable ``agent(observation, instruction) -> actions`` (an action
dict, a list of them, a vendor tool call wrapped by ``deskbox.gym.anthropic_action`` /
``openai_action``, or ``None`` to give up). A class is an agent factory: the runner makes
one per episode, for agents that keep state between steps.

Episodes run on threads, each with its own :class:`~deskbox.gym.DeskboxEnv` over one shared
client; the agent is called on them too, so a slow model call holds only its own episode.
Ctrl-C stops at the next step of every episode, and every session is deleted.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from .._sync import Deskbox
from ..gym import DeskboxEnv, Observation
from .model import Task, TaskError
from .start import StartStates

__all__ = ["Episode", "Summary", "collect_tasks", "run", "summarize", "wilson"]

Agent = Callable[[Observation, str], Any]
AgentSource = Callable[..., Any]


@dataclass(frozen=True)
class Episode:
    """One JSONL line of ``deskbox eval``."""

    task: str
    seed: int
    reward: float
    steps: int
    seconds: float
    error: str | None
    evaluation: str | None = None
    session_id: str | None = None

    @property
    def success(self) -> bool:
        return self.error is None and self.reward >= 1.0


@dataclass(frozen=True)
class Summary:
    task: str
    episodes: int
    successes: int
    errors: int
    rate: float
    low: float  # the 95% Wilson interval of the success rate
    high: float
    mean_steps: float
    mean_seconds: float


def collect_tasks(paths: Iterable[str | Path]) -> list[Task]:
    """Task files, and the task files directly inside directories (``*.yaml``, ``*.yml``,
    ``*.json``, not JSON Schemas), in a stable order; ids must be unique."""
    tasks: list[Task] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json")
                           and not p.name.endswith(".schema.json"))
            if not files:
                raise TaskError(f"{path}: no task files (*.yaml, *.yml, *.json) in it")
            tasks.extend(Task.load(p) for p in files)
        else:
            tasks.append(Task.load(path))
    seen: set[str] = set()
    for task in tasks:
        if task.id in seen:
            raise TaskError(f"task id {task.id!r} is given twice")
        seen.add(task.id)
    return tasks


def run(
    tasks: Sequence[Task],
    agent: AgentSource,
    *,
    client: Deskbox,
    parallel: int = 1,
    repeat: int = 1,
    seed: int = 0,
    env_options: dict[str, Any] | None = None,
    pool: int = 0,
    on_episode: Callable[[Episode], None] | None = None,
) -> list[Episode]:
    """Every task ``repeat`` times (seeds ``seed``, ``seed + 1``, ...), ``parallel`` at once.

    ``pool`` > 0: each task is set up once and snapshotted, and its episodes start from
    copies of the snapshot, ``pool`` of them kept ready (:class:`StartStates`); the
    snapshots are deleted at the end.

    ``on_episode`` is called (on the calling thread) as each episode ends. A
    KeyboardInterrupt stops the episodes at their next step, deletes their sessions, and
    is raised again once they have.
    """
    if parallel < 1 or repeat < 1:
        raise ValueError("parallel and repeat must be at least 1")
    stop = threading.Event()
    jobs = [(task, seed + k) for k in range(repeat) for task in tasks]
    episodes: list[Episode] = []
    options = dict(env_options or {})
    start_states = StartStates(client, pool) if pool > 0 else None
    options["start_states"] = start_states
    try:
        _run_jobs(jobs, agent, client, parallel, stop, options, episodes, on_episode)
    finally:
        if start_states is not None:
            start_states.close()
    return episodes


def _run_jobs(jobs: list[tuple[Task, int]], agent: AgentSource, client: Deskbox,
              parallel: int, stop: threading.Event, env_options: dict[str, Any],
              episodes: list[Episode], on_episode: Callable[[Episode], None] | None) -> None:
    with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="deskbox-eval") as threads:
        pending: set[Future[Episode]] = {
            threads.submit(_episode, client, task, agent, job_seed, stop, env_options)
            for task, job_seed in jobs
        }

        def collect(done: set[Future[Episode]]) -> None:
            for future in done:
                episode = future.result()
                episodes.append(episode)
                if on_episode is not None:
                    on_episode(episode)

        try:
            while pending:
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                collect(done)
        except BaseException:
            # Episodes under way stop at their next step and close their sessions; their
            # records are kept (as "interrupted"), those not started are dropped.
            stop.set()
            running = {future for future in pending if not future.cancel()}
            collect(wait(running).done)
            raise


def _episode(client: Deskbox, task: Task, agent: AgentSource, seed: int,
             stop: threading.Event, env_options: dict[str, Any]) -> Episode:
    started = time.monotonic()
    reward, steps = 0.0, 0
    error: str | None = None
    info: dict[str, Any] = {}
    session_id: str | None = None
    env = DeskboxEnv(client=client, task=task, **env_options)
    try:
        act: Agent = agent() if isinstance(agent, type) else agent
        observation, info = env.reset(seed=seed)
        session_id = info.get("session_id")
        while not stop.is_set():
            actions = act(observation, task.instruction)
            if actions is None:  # the agent gives up
                break
            observation, score, terminated, truncated, info = env.step(actions)
            reward, steps = float(score), steps + 1
            if terminated or truncated:
                break
        else:
            error = "interrupted"
    except Exception as failure:  # an episode's failure is its record, not the run's end
        error = f"{type(failure).__name__}: {failure}"
    except SystemExit as failure:  # an agent that called sys.exit(): its episode ends
        error = f"the agent exited ({failure.code})"
    finally:
        try:
            env.close()
        except Exception as failure:  # its session could not be deleted (the server away)
            error = error or f"closing its session: {type(failure).__name__}: {failure}"
    return Episode(task.id, seed, reward, steps, round(time.monotonic() - started, 3), error,
                   info.get("evaluation"), session_id)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate: sound at 0 and n successes, where the
    normal approximation gives an interval of width zero."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(episodes: Sequence[Episode]) -> list[Summary]:
    """One row per task (in the order they first ended), then ``all``."""
    by_task: dict[str, list[Episode]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task, []).append(episode)
    rows = [_row(task, items) for task, items in by_task.items()]
    if len(by_task) > 1:
        rows.append(_row("all", list(episodes)))
    return rows


def _row(name: str, items: list[Episode]) -> Summary:
    successes = sum(e.success for e in items)
    low, high = wilson(successes, len(items))
    return Summary(name, len(items), successes, sum(e.error is not None for e in items),
                   successes / len(items), low, high,
                   statistics.fmean(e.steps for e in items),
                   statistics.fmean(e.seconds for e in items))


def write_jsonl(episode: Episode, stream: IO[str]) -> None:
    record = asdict(episode)
    stream.write(json.dumps(record, ensure_ascii=False) + "\n")
    stream.flush()
