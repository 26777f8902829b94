"""The agent's packed XTEST FakeInput requests (deskbox_agent.desktop.fakeinput) are the
bytes python-xlib would send, and the X server acts on them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from Xlib import X
from Xlib.display import Display
from Xlib.ext import xtest

from deskbox_agent.desktop.fakeinput import FakeInput

from ..local_desktop import HostDesktop


@pytest.fixture(scope="module")
def display() -> Iterator[Display]:
    with HostDesktop(browser=False) as desktop:
        connection = Display(desktop.display_name)
        yield connection
        connection.close()


@pytest.mark.parametrize(("event_type", "detail", "x", "y"), [
    (X.MotionNotify, 0, 0, 0), (X.MotionNotify, 0, 1279, 799), (X.MotionNotify, 0, 16384, 7),
    (X.ButtonPress, 1, 0, 0), (X.ButtonRelease, 9, 0, 0), (X.KeyPress, 255, 0, 0),
    (X.KeyRelease, 8, 0, 0), (X.MotionNotify, 0, -5, -32768),
])
def test_the_packed_request_is_python_xlibs(display: Display, event_type: int, detail: int,
                                            x: int, y: int) -> None:
    major = display.display.get_extension_major(xtest.extname)
    expected = xtest.FakeInput._request.to_binary(
        opcode=major, event_type=event_type, detail=detail, time=X.CurrentTime, root=X.NONE,
        x=x, y=y)
    assert FakeInput(display).request(event_type, detail, x, y) == expected


def test_packed_motion_and_buttons_reach_the_x_server(display: Display) -> None:
    fake = FakeInput(display)
    root = display.screen().root
    for x, y in ((10, 20), (1279, 799), (640, 400)):
        fake.send(X.MotionNotify, x=x, y=y)
        display.sync()
        pointer = root.query_pointer()
        assert (pointer.root_x, pointer.root_y) == (x, y)
    fake.send(X.ButtonPress, 1)
    display.sync()
    assert root.query_pointer().mask & X.Button1Mask
    fake.send(X.ButtonRelease, 1)
    display.sync()
    assert not root.query_pointer().mask & X.Button1Mask
