"""``deskbox eval``, run as users run it: the real command against a real server. It runs
every task ``--repeat`` times on ``--parallel`` desktops at once, writes one JSONL line per
episode, prints each task's success rate with its interval, and deletes every session,
also when an agent breaks or the run is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deskbox import Deskbox

from ..api.conftest import KEY_A, Server
from .conftest import TASKS_DIR, live_sessions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DESKBOX = str(Path(sys.executable).parent / "deskbox")
SOLVERS = f"{TASKS_DIR}/solvers.py"


def deskbox_eval(server: Server, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DESKBOX, "eval", *args], capture_output=True, text=True, cwd=cwd,
                          env=_env(server), timeout=150, check=False)


def _env(server: Server) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    return {**env, "DESKBOX_URL": server.url, "DESKBOX_API_KEY": KEY_A, "COLUMNS": "120"}


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_solvers_on_two_tasks_twice_each_two_at_once(task_server: Server,
                                                     tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    done = deskbox_eval(task_server, str(TASKS_DIR / "click-button.yaml"),
                        str(TASKS_DIR / "navigate-link.yaml"), "--agent",
                        f"{SOLVERS}:solve", "--parallel", "2", "--repeat", "2",
                        "--seed", "7", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = records(out)
    assert sorted((r["task"], r["seed"]) for r in lines) == [
        ("click-button", 7), ("click-button", 8), ("navigate-link", 7), ("navigate-link", 8)]
    for line in lines:
        assert set(line) == {"task", "seed", "reward", "steps", "seconds", "error",
                             "evaluation", "session_id"}
        assert (line["reward"], line["steps"], line["error"]) == (1.0, 1, None)
        assert 0 < line["seconds"] < 60
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
    assert rows["click-button"][1:5] == ["2", "100%", "34%–100%", "0"]
    assert rows["all"][1:5] == ["4", "100%", "51%–100%", "0"]
    assert f"4 episodes written to {out}" in done.stderr
    with Deskbox(task_server.url, KEY_A) as box:
        assert live_sessions(box) == []


def test_an_agent_that_does_nothing_scores_0_and_one_that_breaks_is_an_error(
        task_server: Server, tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(
        "def broken(observation, instruction):\n"
        "    raise RuntimeError('the model is down')\n")
    task = str(TASKS_DIR / "click-button.yaml")
    idle = deskbox_eval(task_server, task, "--agent", f"{SOLVERS}:noop",
                        "--out", "idle.jsonl", cwd=tmp_path)
    assert idle.returncode == 0, idle.stderr
    [line] = records(tmp_path / "idle.jsonl")
    assert (line["reward"], line["steps"], line["error"]) == (0.0, 10, None)  # max_steps
    assert "0%" in idle.stdout
    broken = deskbox_eval(task_server, task, "--agent", "agents.py:broken",
                          "--out", "broken.jsonl", cwd=tmp_path)
    assert broken.returncode == 1
    [line] = records(tmp_path / "broken.jsonl")
    assert line["error"] == "RuntimeError: the model is down" and line["reward"] == 0.0
    assert "click-button (seed 0): RuntimeError: the model is down" in broken.stderr
    # One that calls sys.exit(): its episode's error, not the whole run's traceback.
    (tmp_path / "agents.py").write_text(
        "import sys\n"
        "def leaves(observation, instruction):\n"
        "    sys.exit(3)\n")
    left = deskbox_eval(task_server, task, "--agent", "agents.py:leaves", "--repeat", "2",
                        "--out", "left.jsonl", cwd=tmp_path)
    assert left.returncode == 1, left.stderr
    assert [r["error"] for r in records(tmp_path / "left.jsonl")] == [
        "the agent exited (3)"] * 2
    assert "Traceback" not in left.stderr
    with Deskbox(task_server.url, KEY_A) as box:
        assert live_sessions(box) == []


@pytest.mark.parametrize(("args", "message"), [
    (["nowhere.yaml", "--agent", f"{SOLVERS}:solve"], "nowhere.yaml: No such file"),
    ([str(TASKS_DIR / "click-button.yaml"), "--agent", "agents_absent.py:solve"],
     "no Python file"),
    ([str(TASKS_DIR / "click-button.yaml"), "--agent", f"{SOLVERS}:absent"],
     "has no absent"),
    # The ":name" left off, and an agent file that does not even compile: tracebacks before.
    ([str(TASKS_DIR / "click-button.yaml"), "--agent", SOLVERS], "name a callable as"),
    ([str(TASKS_DIR / "click-button.yaml"), "--agent", "broken_agent.py:solve"],
     "SyntaxError"),
])
def test_tasks_or_agents_that_cannot_be_loaded_exit_2(task_server: Server, tmp_path: Path,
                                                      args: list[str], message: str) -> None:
    (tmp_path / "broken_agent.py").write_text("def solve(:\n")
    done = deskbox_eval(task_server, *args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["broken_agent.py"]  # no JSONL


def test_ctrl_c_stops_every_episode_and_deletes_its_session(task_server: Server,
                                                            tmp_path: Path) -> None:
    (tmp_path / "slow.py").write_text(
        "import time\n"
        "def agent(observation, instruction):\n"
        "    time.sleep(0.3)\n"
        "    return [{'type': 'wait', 'ms': 0}]\n")
    process = subprocess.Popen(
        [DESKBOX, "eval", str(TASKS_DIR), "--agent", "slow.py:agent", "--parallel", "2",
         "--out", "run.jsonl"], cwd=tmp_path, env=_env(task_server), text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with Deskbox(task_server.url, KEY_A) as box:
        deadline = time.monotonic() + 60
        while len(live_sessions(box)) < 2:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "interrupted after" in stderr and "their sessions are deleted" in stderr
        assert live_sessions(box) == []
    lines = records(tmp_path / "run.jsonl")
    assert lines and all(line["error"] == "interrupted" for line in lines)


def test_a_clean_up_that_fails_is_said_in_one_line_after_the_summary(
    task_server: Server, tmp_path: Path,
) -> None:
    """With ``--pool`` the run deletes its start states' snapshots at the end; one deleted
    behind its back (here by the agent itself) made that a traceback, with no summary."""
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import runpy\n"
        "from deskbox import Deskbox\n"
        f"solved = runpy.run_path({str(TASKS_DIR / 'solvers.py')!r})['solve']\n"
        "def solve(observation, instruction):\n"
        "    with Deskbox() as box:\n"
        "        for snapshot in box.snapshots.list():\n"
        "            box.snapshots.delete(snapshot.id)\n"
        "    return solved(observation, instruction)\n")
    out = tmp_path / "run.jsonl"
    done = deskbox_eval(task_server, str(TASKS_DIR / "click-button.yaml"), "--agent",
                        f"{agent}:solve", "--pool", "1", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "start states' snapshots could not be deleted" in done.stderr, done.stderr
    assert [line["reward"] for line in records(out)] == [1.0]
    assert any(row.startswith("click-button") for row in done.stdout.splitlines()), done.stdout
    with Deskbox(task_server.url, KEY_A) as box:
        assert live_sessions(box) == [] and box.snapshots.list() == []
