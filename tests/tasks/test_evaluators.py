"""Setups and evaluators against a real desktop: each kind of evaluator scores 1 only for the
state it names and says what it found; a failing setup stops the episode before it starts
and deletes its desktop; a JavaScript evaluator runs in the page through DevTools without
anything showing on the screen."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deskbox import Deskbox, Session, cdp
from deskbox.gym import DeskboxEnv
from deskbox.tasks import Task, TaskError, evaluate, prepare

from .conftest import live_sessions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LINKS = """<!doctype html><body style="margin:0">
<a href="other.html" target="_blank" style="display:block;height:100vh">other</a>"""
PAGE = """<!doctype html><title>Counter</title>
<body style="margin:0;background:#ffffff"><script>window.count = 3;</script></body>"""


def task(evaluator: dict[str, Any], **fields: Any) -> Task:
    return Task.model_validate({"id": "t", "instruction": "do it", "evaluator": evaluator,
                                **fields})


@pytest.fixture(scope="module")
def session(task_server: Any) -> Iterator[Session]:
    from ..api.conftest import KEY_A

    with Deskbox(task_server.url, KEY_A) as client:
        with client.sessions.create(display={"width": 800, "height": 600}) as created:
            prepare(created, task({"type": "url", "pattern": "x"}, setup={
                "files": [{"path": "/tmp/t/page.html", "content": PAGE},
                          {"path": "/tmp/t/other.html", "content": "<title>Other</title>"}],
                "start_url": "file:///tmp/t/page.html"}))
            yield created


def score(session: Session, evaluator: dict[str, Any], **fields: Any) -> tuple[float, str]:
    found = evaluate(session, task(evaluator, **fields))
    return found.reward, found.detail


def test_exec_scores_the_exit_code_and_the_output(session: Session) -> None:
    assert score(session, {"type": "exec", "cmd": ["sh", "-c", "echo ready"]})[0] == 1.0
    assert score(session, {"type": "exec", "cmd": ["sh", "-c", "echo ready"],
                           "regex": r"^ready$"})[0] == 1.0
    assert score(session, {"type": "exec", "cmd": ["sh", "-c", "echo no"],
                           "equals": "ready\n"}) == (0.0, "sh's output: 'no\\n'")
    assert score(session, {"type": "exec", "cmd": ["false"]}) == (0.0, "false exited 1")
    assert score(session, {"type": "exec", "cmd": ["false"], "exit_code": None})[0] == 1.0


def test_file_scores_the_content_and_a_missing_file_is_0(session: Session) -> None:
    session.upload("/tmp/t/answer.txt", b"total: 42\n")
    assert score(session, {"type": "file", "path": "/tmp/t/answer.txt",
                           "contains": "42"})[0] == 1.0
    assert score(session, {"type": "file", "path": "/tmp/t/answer.txt",
                           "equals": "total: 41\n"})[0] == 0.0
    assert score(session, {"type": "file", "path": "/tmp/t/none.txt"}) == (
        0.0, "no file /tmp/t/none.txt")


def test_js_reads_the_page_and_an_exception_scores_0(session: Session) -> None:
    assert score(session, {"type": "js", "expression": "window.count", "equals": 3})[0] == 1.0
    assert score(session, {"type": "js", "expression": "[count, document.title]",
                           "equals": [3, "Counter"]})[0] == 1.0
    assert score(session, {"type": "js", "expression": "window.count > 5"}) == (
        0.0, "the expression is False")
    reward, detail = score(session, {"type": "js", "expression": "missing.value"})
    assert reward == 0.0 and "ReferenceError: missing is not defined" in detail
    reward, detail = score(session, {"type": "js", "expression": "1", "page": "nowhere"})
    assert reward == 0.0 and "no a tab whose URL matches 'nowhere'" in detail


def test_url_scores_the_active_tab_or_any_tab(box: Deskbox) -> None:
    with box.sessions.create(display={"width": 800, "height": 600}) as session:
        prepare(session, task({"type": "url", "pattern": "x"}, setup={
            "files": [{"path": "/tmp/t/links.html", "content": LINKS},
                      {"path": "/tmp/t/other.html", "content": "<title>Other</title>"}],
            "start_url": "file:///tmp/t/links.html"}))
        assert score(session, {"type": "url", "pattern": r"/links\.html$"})[0] == 1.0
        assert score(session, {"type": "url", "pattern": r"/other\.html$"})[0] == 0.0
        session.click(400, 300)  # the link opens other.html in a new tab, in front
        deadline = time.monotonic() + 10
        while len(cdp.pages(session)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert score(session, {"type": "url", "pattern": r"/other\.html$"})[0] == 1.0
        assert score(session, {"type": "url", "pattern": r"/links\.html$"})[0] == 0.0
        assert score(session, {"type": "url", "pattern": r"/links\.html$",
                               "tab": "any"})[0] == 1.0


def test_python_callables_from_a_module_or_a_file(session: Session, tmp_path: Path) -> None:
    (tmp_path / "check.py").write_text(
        "def title_is(session, task, title):\n"
        "    from deskbox import cdp\n"
        "    return cdp.evaluate(session, 'document.title') == title\n"
        "def words(session, task):\n"
        "    return 'yes'\n")
    (tmp_path / "t.json").write_text(
        '{"id": "t", "instruction": "i", "evaluator": {"type": "python", '
        '"callable": "check.py:title_is", "args": {"title": "Counter"}}}')
    assert evaluate(session, Task.load(tmp_path / "t.json")).reward == 1.0
    with pytest.raises(TaskError, match="check.py:words returned str, not a number"):
        evaluate(session, Task.load(tmp_path / "t.json").model_copy(update={
            "evaluator": task({"type": "python", "callable": "check.py:words"}).evaluator}))
    with pytest.raises(TaskError, match="json:nothing_here: json has no nothing_here"):
        score(session, {"type": "python", "callable": "json:nothing_here"})
    with pytest.raises(TaskError, match="no Python file"):
        score(session, {"type": "python", "callable": "absent.py:f"})


def test_the_evaluator_leaves_the_page_as_it_was(session: Session) -> None:
    def page() -> np.ndarray:
        # Below the browser's toolbar, whose address-bar caret may blink meanwhile.
        return np.asarray(session.screenshot(format="png", as_image=True))[120:]

    before = page()
    for evaluator in ({"type": "js", "expression": "document.title"},
                      {"type": "exec", "cmd": ["true"]}, {"type": "url", "pattern": "t"}):
        score(session, evaluator)
    np.testing.assert_array_equal(page(), before)


def test_a_failing_setup_ends_the_reset_and_deletes_its_desktop(box: Deskbox) -> None:
    broken = task({"type": "url", "pattern": "x"}, setup={
        "exec": [{"cmd": ["sh", "-c", "echo no such thing >&2; exit 3"]}]})
    before = live_sessions(box)
    env = DeskboxEnv(client=box, task=broken)
    with pytest.raises(TaskError, match=r"setup command .* exited 3: no such thing"):
        env.reset()
    assert env.session is None and live_sessions(box) == before
    env.close()


def test_a_start_page_that_does_not_load_is_a_task_error(box: Deskbox) -> None:
    before = live_sessions(box)
    broken = task({"type": "url", "pattern": "x"},
                  setup={"start_url": "file:///tmp/missing/page.html"})
    with pytest.raises(TaskError, match="start page"), DeskboxEnv(client=box, task=broken) as env:
        env.reset()
    assert live_sessions(box) == before
