"""Bad input is a typed error and a dead desktop is reported as failed, never a crash."""

from __future__ import annotations

import os
import signal

import pytest
from pydantic import ValidationError

from deskbox_server.driver.desktop import Desktop
from deskbox_server.driver.local import LocalDesktop
from deskbox_server.errors import DesktopFailed, InvalidAction, InvalidRequest
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Size


@pytest.mark.parametrize(
    "action",
    [
        a.Click(x=1280, y=10),
        a.Click(x=10, y=800),
        a.Move(x=5000, y=5),
        a.Drag(path=[(10, 10), (1300, 10)]),
        a.Key(keys="ctrl+nosuchkey"),
        a.Key(keys="ctrl+"),
        a.Click(x=10, y=10, modifiers=["hyperdrive"]),
        a.Screenshot(region=a.Region(x=1200, y=0, width=100, height=10)),
        a.Click(x=10),
    ],
)
def test_impossible_actions_raise_invalid_action(desktop: Desktop, action: a.Action) -> None:
    with pytest.raises(InvalidAction) as raised:
        desktop.perform(action)
    assert isinstance(raised.value, InvalidRequest) and raised.value.status == 422
    # The desktop still works afterwards.
    assert desktop.perform(a.ScreenSize()) == Size(width=1280, height=800)


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "drag", "path": []},
        {"type": "drag", "path": [[1, 1]]},
        {"type": "click", "button": "thumb"},
        {"type": "click", "count": 4},
        {"type": "type", "text": "x" * (a.MAX_TYPE_CHARS + 1)},
        {"type": "wait", "ms": a.MAX_WAIT_MS + 1},
        {"type": "teleport"},
        {"type": "click", "x": -1, "y": 0},
        {"type": "click", "x": 1, "y": 1, "extra": True},
    ],
)
def test_malformed_actions_are_rejected_by_the_schema(payload: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        a.ActionAdapter.validate_python(payload)


def test_batch_stops_at_the_first_error(desktop: Desktop) -> None:
    desktop.perform(a.Move(x=10, y=10))
    with pytest.raises(InvalidAction):
        desktop.run([a.Move(x=20, y=20), a.Key(keys="bogus"), a.Move(x=30, y=30)])
    from deskbox_server.schemas.results import Point

    assert desktop.perform(a.CursorPosition()) == Point(x=20, y=20)


@pytest.mark.parametrize("victim", ["Xvfb", "chromium", "openbox"])
def test_a_killed_desktop_is_reported_failed(victim: str) -> None:
    with LocalDesktop(browser=victim == "chromium") as local:
        assert local.desktop is not None
        child = next(c for c in local.processes.children if c.name == victim)
        os.kill(child.popen.pid, signal.SIGKILL)
        child.popen.wait(timeout=5)
        with pytest.raises(DesktopFailed) as raised:
            local.desktop.perform(a.Screenshot())
        assert victim in raised.value.message
        assert "signal 9" in raised.value.message
