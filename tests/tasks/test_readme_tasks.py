"""The README's "RL and evaluation" examples, pasted as they are, against a real server
(the container backend: task setups upload files). Only ``my_agent``, which the README
leaves to the reader, is given: the example tasks' scripted solver."""

from __future__ import annotations

import json
import sys

from ..api.conftest import KEY_A, Server
from ..clients.test_readme import block_starting, run
from .conftest import TASKS_DIR, live_sessions

REPO = TASKS_DIR.parent
MY_AGENT = ("from pathlib import Path\nfrom deskbox.tasks import load_callable\n"
            "my_agent = load_callable('solvers.py:solve', Path('tasks'))\n")


def test_the_gymnasium_loop(task_server: Server) -> None:
    from deskbox import Deskbox

    code = MY_AGENT + block_starting("python", "import gymnasium as gym")
    code += "\nprint(reward, terminated, info['steps'])\n"
    done = run([sys.executable, "-c", code], task_server, REPO)
    assert done.stdout.split("\n")[-2] == "1.0 True 1"  # solved at the first step
    with Deskbox(task_server.url, KEY_A) as box:
        assert live_sessions(box) == []  # close() deleted the episode's session


def test_the_eval_command(task_server: Server, tmp_path: object) -> None:
    command = block_starting("sh", "deskbox eval").strip()
    out = f"{tmp_path}/run.jsonl"
    done = run(["bash", "-euc", command.replace("--out run.jsonl", f"--out {out}")],
               task_server, REPO)
    with open(out) as jsonl:
        lines = [json.loads(line) for line in jsonl]
    failed = [line for line in lines if line["reward"] != 1.0]
    assert len(lines) == 13 and failed == [], json.dumps(failed, indent=1)
    assert [row.split()[:3] for row in done.stdout.splitlines() if row.startswith("all")] == [
        ["all", "13", "100%"]]
