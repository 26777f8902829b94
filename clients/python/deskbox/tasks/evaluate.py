"""Evaluators: a task's reward, read from the desktop's real state.

They run in the process that drives the episode, through the API's own exec, files and
DevTools endpoints, never through the actions the model sends: nothing they do shows on the
screen, and nothing the model does can call them.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

from .. import cdp
from .._errors import NotFound
from .._sync import Session
from .model import (
    ExecEvaluator,
    FileEvaluator,
    JsEvaluator,
    Match,
    PythonEvaluator,
    Task,
    TaskError,
    UrlEvaluator,
)

__all__ = ["Evaluation", "evaluate", "load_callable"]

# Episodes run on threads (``deskbox eval --parallel``): a task's file is loaded once.
_LOADING = threading.Lock()


@dataclass(frozen=True)
class Evaluation:
    reward: float
    #: Why, in a few words: what was found, for the episode's info and the JSONL record.
    detail: str


def evaluate(session: Session, task: Task) -> Evaluation:
    check = task.evaluator
    if isinstance(check, ExecEvaluator):
        return _exec(session, check)
    if isinstance(check, FileEvaluator):
        return _file(session, check)
    if isinstance(check, JsEvaluator):
        return _js(session, check)
    if isinstance(check, UrlEvaluator):
        return _url(session, check)
    if isinstance(check, PythonEvaluator):
        fn = load_callable(check.callable, task.base_dir)
        value = fn(session, task, **check.args)
        if not isinstance(value, bool | int | float):
            raise TaskError(f"{check.callable} returned {type(value).__name__}, not a number")
        return Evaluation(float(value), f"{check.callable} returned {value!r}")
    assert_never(check)


def _exec(session: Session, check: ExecEvaluator) -> Evaluation:
    result = session.exec(check.cmd, timeout_s=check.timeout_s)
    if result.timed_out:
        return Evaluation(0.0, f"{check.cmd[0]} timed out")
    if check.exit_code is not None and result.exit_code != check.exit_code:
        return Evaluation(0.0, f"{check.cmd[0]} exited {result.exit_code}")
    return _matched(check, result.stdout, f"{check.cmd[0]}'s output")


def _file(session: Session, check: FileEvaluator) -> Evaluation:
    try:
        data = session.download(check.path)
    except NotFound:
        return Evaluation(0.0, f"no file {check.path}")
    return _matched(check, data.decode("utf-8", "replace"), check.path)


def _js(session: Session, check: JsEvaluator) -> Evaluation:
    try:
        value = cdp.evaluate(session, check.expression, page=check.page)
    except cdp.DevToolsError as error:
        return Evaluation(0.0, str(error))
    reward = 1.0 if value == check.equals else 0.0
    return Evaluation(reward, f"the expression is {_short(value)}")


def _url(session: Session, check: UrlEvaluator) -> Evaluation:
    tabs = cdp.pages(session)
    urls = [page.url for page in (tabs if check.tab == "any" else tabs[:1])]
    found = any(re.search(check.pattern, url) for url in urls)
    return Evaluation(1.0 if found else 0.0, f"tab URLs {_short(urls)}")


def _matched(match: Match, text: str, what: str) -> Evaluation:
    if match.equals is not None:
        found = text == match.equals
    elif match.contains is not None:
        found = match.contains in text
    elif match.regex is not None:
        found = re.search(match.regex, text) is not None
    else:
        found = True
    return Evaluation(1.0 if found else 0.0, f"{what}: {_short(text)}")


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def load_callable(spec: str, base_dir: Path) -> Callable[..., Any]:
    """``module:name`` (importable) or ``path/to/file.py:name`` (relative to ``base_dir``)."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise TaskError(f"{spec}: name a callable as module:name or path/to/file.py:name")
    if where.endswith(".py"):
        path = (base_dir / where).resolve()
        module_name = f"deskbox_task_{abs(hash(path)):x}"
        with _LOADING:
            module = sys.modules.get(module_name)
            if module is None:
                loaded = importlib.util.spec_from_file_location(module_name, path)
                if loaded is None or loaded.loader is None or not path.is_file():
                    raise TaskError(f"{spec}: no Python file {path}")
                module = importlib.util.module_from_spec(loaded)
                try:
                    loaded.loader.exec_module(module)
                except Exception as error:  # its own code failed: a SyntaxError, an import
                    raise TaskError(f"{spec}: {path} failed to load: "
                                    f"{type(error).__name__}: {error}") from error
                sys.modules[module_name] = module
    else:
        try:
            module = importlib.import_module(where)
        except Exception as error:  # not found, or its own code failed
            raise TaskError(f"{spec}: cannot import {where}: {type(error).__name__}: "
                            f"{error}") from error
    target: Any = module
    for part in name.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise TaskError(f"{spec}: {where} has no {name}")
    if not callable(target):
        raise TaskError(f"{spec}: {name} is not callable")
    fn: Callable[..., Any] = target
    return fn
