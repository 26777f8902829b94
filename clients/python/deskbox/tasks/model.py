"""The task format (docs/TASKS.md; JSON Schema: tasks/task.schema.json).

A task is what an episode starts from and how it is scored: an instruction for the model,
a setup that brings a new desktop to the start state, limits, and an evaluator that reads
the reward from the desktop's real state (a command's result, a file, the page through
DevTools, the tab's URL, or a Python callable), never from what the model says.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

__all__ = [
    "Command", "Evaluator", "ExecEvaluator", "File", "FileEvaluator", "JsEvaluator",
    "Limits", "Match", "PythonEvaluator", "Setup", "Task", "TaskError", "UrlEvaluator",
]

AbsolutePath = Annotated[str, Field(pattern=r"^/", max_length=4096,
                                    description="an absolute path inside the sandbox")]
Regex = Annotated[str, Field(min_length=1, max_length=10_000,
                             description="a Python regular expression, searched for")]


class TaskError(ValueError):
    """A task file that cannot be read or used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class File(_Strict):
    """A file put into the sandbox before the episode: ``source`` (a path relative to the
    task file) or ``content`` (text), exactly one."""

    path: AbsolutePath
    source: str | None = None
    content: str | None = None

    @model_validator(mode="after")
    def _one_origin(self) -> File:
        if (self.source is None) == (self.content is None):
            raise ValueError("give exactly one of source and content")
        return self


class Command(_Strict):
    """A command run in the sandbox (no shell; argv). ``background``: started, not waited
    for (a program the task needs open, like a terminal); otherwise it must exit 0."""

    cmd: list[str] = Field(min_length=1)
    background: bool = False
    timeout_s: float = Field(30, gt=0, le=600)


class Setup(_Strict):
    """What brings a new desktop to the task's start state, in this order: the snapshot it
    starts from, files, commands, then the start page opened in the active tab."""

    snapshot: str | None = Field(None, description="a snapshot id to start from")
    files: list[File] = []
    exec: list[Command] = []
    start_url: str | None = None


class Limits(_Strict):
    max_steps: int = Field(20, ge=1, le=10_000)
    timeout_s: float = Field(300, gt=0, le=86_400, description="an episode's wall-clock limit")


class Match(_Strict):
    """How a text is checked: ``equals``, ``contains`` or ``regex`` (at most one; none
    accepts any text)."""

    equals: str | None = None
    contains: str | None = None
    regex: Regex | None = None

    @model_validator(mode="after")
    def _at_most_one(self) -> Match:
        if sum(v is not None for v in (self.equals, self.contains, self.regex)) > 1:
            raise ValueError("give at most one of equals, contains and regex")
        return self


class ExecEvaluator(Match):
    """1 when ``cmd`` exits with ``exit_code`` (``null``: any) and its stdout matches."""

    type: Literal["exec"]
    cmd: list[str] = Field(min_length=1)
    exit_code: int | None = 0
    timeout_s: float = Field(30, gt=0, le=600)


class FileEvaluator(Match):
    """1 when the file exists and its text matches."""

    type: Literal["file"]
    path: AbsolutePath


class JsEvaluator(_Strict):
    """1 when ``expression``, evaluated in the tab (the active one, or the most recently
    active one whose URL ``page`` finds), equals ``equals`` (JSON; default ``true``). An
    expression that throws scores 0."""

    type: Literal["js"]
    expression: str = Field(min_length=1, max_length=100_000)
    equals: Any = True
    page: Regex | None = None


class UrlEvaluator(_Strict):
    """1 when the active tab's URL (``tab: any``: some tab's) matches ``pattern``."""

    type: Literal["url"]
    pattern: Regex
    tab: Literal["active", "any"] = "active"


class PythonEvaluator(_Strict):
    """``callable`` (``module:name``, or ``file.py:name`` relative to the task file) is
    called as ``fn(session, task, **args)`` and returns the reward (a number or a bool)."""

    type: Literal["python"]
    callable: str = Field(pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_.]*$")
    args: dict[str, Any] = {}


Evaluator = Annotated[
    ExecEvaluator | FileEvaluator | JsEvaluator | UrlEvaluator | PythonEvaluator,
    Field(discriminator="type"),
]


class Task(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str | None = Field(None, alias="$schema", description="the schema's URL or path")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,127}$")
    instruction: str = Field(min_length=1, max_length=20_000)
    setup: Setup = Setup()
    limits: Limits = Limits()
    evaluator: Evaluator
    # Where the file was read from: ``File.source`` and ``*.py`` callables are relative to it.
    _base_dir: Path | None = PrivateAttr(None)

    @classmethod
    def load(cls, path: str | Path) -> Task:
        """A task from a ``.json``, ``.yaml`` or ``.yml`` file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise TaskError(f"{path}: {error.strerror or error}") from error
        try:
            task = cls.model_validate(_parse(path, text))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
                for e in error.errors())
            raise TaskError(f"{path}: {problems}") from None
        task._base_dir = path.parent.resolve()
        return task

    @property
    def base_dir(self) -> Path:
        return self._base_dir or Path.cwd()


def _parse(path: Path, text: str) -> dict[str, Any]:
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # only YAML tasks need PyYAML
        except ModuleNotFoundError:
            raise TaskError(f"{path}: YAML task files need PyYAML "
                            "(pip install 'deskbox[gym]')") from None

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise TaskError(f"{path}: not valid YAML: {error}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as error:
            raise TaskError(f"{path}: not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: a task is an object, not {type(data).__name__}")
    return data


def schema() -> dict[str, Any]:
    """The JSON Schema of a task file (tasks/task.schema.json is this, written out)."""
    document = Task.model_json_schema(by_alias=True, mode="validation")
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "Deskbox task"
    return document
