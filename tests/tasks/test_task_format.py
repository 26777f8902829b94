"""The task format: tasks/task.schema.json is the model's schema, every example is valid by
it, and a bad task file is refused with its name and the field at fault."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from deskbox.tasks import Task, TaskError, schema
from deskbox.tasks.runner import Episode, collect_tasks, summarize, wilson

from .conftest import EXAMPLE_TASKS, TASKS_DIR

SCHEMA_FILE = TASKS_DIR / "task.schema.json"
REGENERATE = ("python -c 'import json, deskbox.tasks as t; "
              "print(json.dumps(t.schema(), indent=2, ensure_ascii=False))' "
              "> tasks/task.schema.json")


def test_the_schema_file_is_the_models_schema() -> None:
    written = json.loads(SCHEMA_FILE.read_text())
    assert written == schema(), f"tasks/task.schema.json is stale: {REGENERATE}"
    jsonschema.Draft202012Validator.check_schema(written)


@pytest.mark.parametrize("path", EXAMPLE_TASKS, ids=lambda p: p.stem)
def test_every_example_is_valid_by_the_schema_and_loads(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()), json.loads(SCHEMA_FILE.read_text()))
    task = Task.load(path)
    assert task.id == path.stem and task.base_dir == TASKS_DIR
    for file in task.setup.files:
        assert file.source is not None and (TASKS_DIR / file.source).is_file()


@pytest.mark.parametrize(("text", "message"), [
    ('{"id": "a", "instruction": "x"}', "evaluator: Field required"),
    ('{"id": "a", "instruction": "x", "evaluator": {"type": "sql"}}', "evaluator: Input tag"),
    ('{"id": "a", "instruction": "x", "speed": 1, "evaluator": {"type": "url", '
     '"pattern": "x"}}', "speed: Extra inputs are not permitted"),
    ('{"id": "A b", "instruction": "x", "evaluator": {"type": "url", "pattern": "x"}}',
     "id: String should match pattern"),
    ('{"id": "a", "instruction": "x", "setup": {"files": [{"path": "/f", "source": "s", '
     '"content": "c"}]}, "evaluator": {"type": "url", "pattern": "x"}}',
     "setup.files.0: Value error, give exactly one of source and content"),
    ('{"id": "a", "instruction": "x", "setup": {"files": [{"path": "rel", "content": "c"}]}, '
     '"evaluator": {"type": "url", "pattern": "x"}}', "setup.files.0.path: String should match"),
    ('{"id": "a", "instruction": "x", "evaluator": {"type": "file", "path": "/f", '
     '"equals": "a", "regex": "b"}}', "give at most one of equals, contains and regex"),
    ('{"id": "a", "instruction": "x", "limits": {"max_steps": 0}, '
     '"evaluator": {"type": "url", "pattern": "x"}}', "limits.max_steps: Input should be"),
    ('[1, 2]', "a task is an object, not list"),
    ('{"id": ', "not valid JSON"),
])
def test_a_bad_task_file_is_refused_with_the_field(tmp_path: Path, text: str,
                                                   message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TaskError) as refused:
        Task.load(path)
    assert str(refused.value).startswith(f"{path}: ") and message in str(refused.value)


def test_bad_yaml_and_missing_files_are_task_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("id: [unclosed\n")
    with pytest.raises(TaskError, match="bad.yaml: not valid YAML"):
        Task.load(tmp_path / "bad.yaml")
    with pytest.raises(TaskError, match="none.yaml: No such file"):
        Task.load(tmp_path / "none.yaml")


def test_collect_tasks_reads_directories_and_refuses_twice_the_same_id(tmp_path: Path) -> None:
    tasks = collect_tasks([TASKS_DIR])
    assert [t.id for t in tasks] == [p.stem for p in EXAMPLE_TASKS]  # not the schema
    with pytest.raises(TaskError, match="task id 'click-button' is given twice"):
        collect_tasks([TASKS_DIR / "click-button.yaml", TASKS_DIR])
    with pytest.raises(TaskError, match="no task files"):
        collect_tasks([tmp_path])


def test_the_summary_gives_wilson_intervals() -> None:
    assert wilson(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    low, high = wilson(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    episodes = [Episode("a", 0, 1.0, 2, 1.0, None), Episode("a", 1, 0.0, 4, 3.0, None),
                Episode("b", 0, 1.0, 1, 2.0, "RuntimeError: broke")]
    a, b, total = summarize(episodes)
    assert (a.task, a.episodes, a.successes, a.rate, a.mean_steps, a.mean_seconds) == (
        "a", 2, 1, 0.5, 3.0, 2.0)
    assert (b.successes, b.errors) == (0, 1)  # an episode that broke is not a success
    assert (total.task, total.episodes, total.successes) == ("all", 3, 1)
