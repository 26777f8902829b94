"""Tasks for RL and evaluation: the task format, setups, evaluators and the runner.

``Task.load("tasks/fill-form.yaml")`` reads a task file (docs/TASKS.md);
``prepare(session, task)`` brings a new desktop to its start state;
``evaluate(session, task)`` reads the reward from the desktop. ``deskbox.gym.DeskboxEnv``
takes a ``task`` and does both, and ``deskbox eval`` (``deskbox.tasks.runner``) runs an
agent over many tasks at once.
"""

from .evaluate import Evaluation, evaluate, load_callable
from .model import Task, TaskError, schema
from .prepare import prepare

__all__ = ["Evaluation", "Task", "TaskError", "evaluate", "load_callable", "prepare", "schema"]
