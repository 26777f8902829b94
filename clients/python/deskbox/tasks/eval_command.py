"""What ``deskbox eval`` prints and writes: a progress bar on stderr, one JSONL line per
episode in ``--out``, and the summary table on stdout."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._errors import DeskboxError
from .._sync import Deskbox
from .evaluate import load_callable
from .model import TaskError
from .runner import Episode, Summary, collect_tasks, run, summarize, write_jsonl

__all__ = ["evaluate_agent", "summary_table"]


def evaluate_agent(
    task_paths: list[str], agent_spec: str, *, url: str | None, api_key: str | None,
    parallel: int, repeat: int, seed: int, out: Path | None, env_options: dict[str, Any],
    pool: int = 0,
) -> int:
    """Run ``deskbox eval``; the exit code: 0 when every episode ran (whatever its reward),
    1 when some ended in an error or the run's own clean-up failed (a start state's snapshot
    not deleted), 2 for tasks or an agent that cannot be loaded or an ``--out`` that cannot
    be written, 130 on Ctrl-C."""
    err = Console(stderr=True)
    try:
        tasks = collect_tasks(task_paths)
        agent = load_callable(agent_spec, Path.cwd())
    except TaskError as error:
        err.print(f"deskbox eval: {error}", markup=False, highlight=False)
        return 2
    out = out or Path(f"deskbox-eval-{datetime.now():%Y%m%d-%H%M%S}.jsonl")
    total = len(tasks) * repeat
    episodes: list[Episode] = []
    progress = Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[successes]} solved, {task.fields[errors]} "
                                   "errors"), TimeElapsedColumn(), console=err)
    try:
        jsonl_file = out.open("w", encoding="utf-8")
    except OSError as error:  # before any desktop is made for episodes it could not keep
        err.print(f"deskbox eval: cannot write {out}: {error.strerror or error}",
                  markup=False, highlight=False)
        return 2
    with jsonl_file as jsonl, Deskbox(url, api_key) as client, progress:
        bar = progress.add_task("eval", total=total, successes=0, errors=0)

        def ended(episode: Episode) -> None:
            episodes.append(episode)
            write_jsonl(episode, jsonl)
            progress.update(bar, advance=1, successes=sum(e.success for e in episodes),
                            errors=sum(e.error is not None for e in episodes))
            if episode.error is not None:
                progress.console.print(f"{episode.task} (seed {episode.seed}): "
                                       f"{episode.error}", markup=False, highlight=False)

        try:
            run(tasks, agent, client=client, parallel=parallel, repeat=repeat, seed=seed,
                env_options=env_options, pool=pool, on_episode=ended)
        except KeyboardInterrupt:
            err.print(f"deskbox eval: interrupted after {len(episodes)} of {total} "
                      "episodes; their sessions are deleted")
            code = 130
        except DeskboxError as error:  # the episodes' own errors are theirs: this is the run's
            err.print(f"deskbox eval: {error}", markup=False, highlight=False)
            code = 1
        else:
            code = 1 if any(e.error is not None for e in episodes) else 0
    if episodes:
        Console(file=sys.stdout, highlight=False).print(summary_table(summarize(episodes)))
    err.print(f"{len(episodes)} episodes written to {out}", markup=False, highlight=False)
    return code


def summary_table(rows: list[Summary]) -> Table:
    table = Table(box=None, pad_edge=False)
    for column in ("task", "episodes", "success", "95% CI", "errors", "mean steps",
                   "mean s"):
        table.add_column(column, justify="left" if column == "task" else "right")
    for row in rows:
        table.add_row(row.task, str(row.episodes), f"{row.rate:.0%}",
                      f"{row.low:.0%}–{row.high:.0%}", str(row.errors),
                      f"{row.mean_steps:.1f}", f"{row.mean_seconds:.1f}")
    return table
