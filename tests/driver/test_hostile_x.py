"""A hostile X server cannot make the host read without bound (issue 13, section 2).

The attack: a process in a session puts its own socket where the host connects, relays to
the real X server and injects one message announcing 300 MiB (then sends the 300 MiB). It
cost the control plane ~110 s of CPU and 640 MB. Here an impostor (tests/impostor_x.py)
does the same in front of this module's real Xvfb, against each kind of host connection:
python-xlib's (input, clipboard, RECORD, readiness checks all use ``open_display``) and
the capture connection's libxcb. Each breach must end that connection within a second, at
little CPU and memory, with ``DesktopFailed`` naming what was sent; the real desktop next
to it goes on working.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from Xlib.error import ConnectionClosedError

from deskbox_server.driver.capture import Capturer
from deskbox_server.driver.clipboard import Clipboard
from deskbox_server.driver.desktop import Desktop
from deskbox_server.driver.keymap_watch import KeymapWatch
from deskbox_server.driver.local import LocalDesktop
from deskbox_server.driver.xconnect import open_display
from deskbox_server.errors import DesktopFailed
from deskbox_server.schemas import actions as a
from tests.impostor_x import MIB, Impostor, events, generic_event, impostor

ATTACK = 300 * MIB
LIMIT = r"\(limit 4\.9 MiB\)"  # a 1280x800 screen's pixels and 1 MiB


@dataclass
class Usage:
    seconds: float = 0.0
    cpu_s: float = 0.0
    rss_growth: int = 0


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def measured(max_rss: int = 4 * MIB) -> Iterator[Usage]:
    """The block (an attack and the call that meets it) is quick and cheap."""
    usage = Usage()
    rss, cpu, started = _rss(), time.process_time(), time.monotonic()
    try:
        yield usage
    finally:
        usage.seconds = time.monotonic() - started
        usage.cpu_s = time.process_time() - cpu
        usage.rss_growth = _rss() - rss
    assert usage.seconds < 1.0, usage
    assert usage.cpu_s < 0.5, usage
    assert usage.rss_growth < max_rss, usage


@pytest.fixture
def fake(local_desktop: LocalDesktop, tmp_path: Path) -> Iterator[Impostor]:
    assert local_desktop.display_name is not None
    with impostor(local_desktop.display_name, tmp_path) as fake:
        yield fake


# -- python-xlib connections --------------------------------------------------------------


def test_xlib_oversize_generic_event_fails_the_connection(fake: Impostor) -> None:
    x = open_display(fake.name)
    try:
        x.sync()  # the impostor relays faithfully until it attacks
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB event {LIMIT}"):
            fake.attack(generic_event(ATTACK), filler=ATTACK)
            x.sync()
        # The connection is closed: every later call fails at once instead of hanging.
        started = time.monotonic()
        with pytest.raises(ConnectionClosedError, match="300 MiB event"):
            x.sync()
        with pytest.raises(ConnectionClosedError):
            x.pending_events()
        assert time.monotonic() - started < 0.1
    finally:
        with suppress(ConnectionClosedError):
            x.close()


def test_xlib_oversize_reply_fails_the_connection(fake: Impostor) -> None:
    x = open_display(fake.name)
    try:
        x.sync()
        fake.inflate_next_reply(ATTACK)
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB reply {LIMIT}"):
            x.sync()
    finally:
        with suppress(ConnectionClosedError):
            x.close()


def test_xlib_oversize_reply_while_connecting(fake: Impostor) -> None:
    """python-xlib reads replies inside ``Display()`` (keymap, extensions): bounded too."""
    fake.inflate_next_reply(ATTACK)
    with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB reply {LIMIT}"):
        open_display(fake.name)


def test_xlib_reply_out_of_sequence_fails_the_connection(fake: Impostor) -> None:
    """python-xlib raises RuntimeError ("Can't happen!") for it: a breach like the others."""
    x = open_display(fake.name)
    try:
        x.sync()
        with measured(), pytest.raises(DesktopFailed, match="malformed message"):
            fake.attack(struct.pack("=BBHI24x", 1, 0, 0xFFFF, 0))
            x.sync()
    finally:
        with suppress(ConnectionClosedError):
            x.close()


def test_xlib_event_flood_is_bounded(fake: Impostor) -> None:
    x = open_display(fake.name)
    try:
        x.sync()
        flood = events(1_000_000)  # 32 MB of events nobody asked for
        with measured(max_rss=16 * MIB), pytest.raises(DesktopFailed, match="events"):
            fake.attack(flood)
            x.sync()
    finally:
        with suppress(ConnectionClosedError):
            x.close()


def _until_raises(call: Callable[[], object], timeout_s: float = 0.9) -> None:
    """Call until it raises: the connection's own thread meets the attack first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        call()
        time.sleep(0.01)


def test_clipboard_owner_breach_fails_the_next_call(fake: Impostor) -> None:
    clipboard = Clipboard(fake.name)
    try:
        clipboard.set("mine")  # its owner thread now serves the selection on its connection
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB event {LIMIT}"):
            fake.attack(generic_event(ATTACK), filler=ATTACK)
            _until_raises(lambda: clipboard.set("again"))
    finally:
        clipboard.close()


def test_keymap_watch_breach_fails_the_next_wait(fake: Impostor) -> None:
    control = open_display(fake.name)
    watch = KeymapWatch(fake.name, control)  # RECORD, on a connection and thread of its own
    try:
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB event {LIMIT}"):
            fake.attack(generic_event(ATTACK), filler=ATTACK)
            _until_raises(lambda: watch.wait_reread(time.monotonic(), timeout_s=0.01))
    finally:
        watch.close()
        with suppress(ConnectionClosedError):
            control.close()


# -- the capture connection (mss over libxcb, through the relay) ---------------------------


@pytest.fixture(params=[True, False], ids=["xshm", "getimage"])
def shared_memory(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_capture_oversize_generic_event_fails(
    fake: Impostor, desktop: Desktop, shared_memory: bool
) -> None:
    capturer = Capturer(fake.name, desktop.x_connection, shared_memory=shared_memory)
    try:
        assert capturer.grab(0, 0, 1280, 800).pixels.shape == (800, 1280, 4)
        assert capturer.method == ("xshm" if shared_memory else "getimage")
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB event {LIMIT}"):
            fake.attack(generic_event(ATTACK), filler=ATTACK)
            capturer.grab(0, 0, 1280, 800)
        with pytest.raises(DesktopFailed, match="300 MiB event"):
            capturer.grab(0, 0, 1280, 800)
    finally:
        capturer.close()


def test_capture_oversize_reply_fails(
    fake: Impostor, desktop: Desktop, shared_memory: bool
) -> None:
    capturer = Capturer(fake.name, desktop.x_connection, shared_memory=shared_memory)
    try:
        capturer.grab(0, 0, 1280, 800)
        fake.inflate_next_reply(ATTACK)
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB reply {LIMIT}"):
            capturer.grab(0, 0, 1280, 800)
    finally:
        capturer.close()


def test_capture_oversize_reply_while_connecting(fake: Impostor, desktop: Desktop) -> None:
    fake.inflate_next_reply(ATTACK)
    with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB reply {LIMIT}"):
        Capturer(fake.name, desktop.x_connection).close()


def test_capture_event_flood_is_dropped_then_fails(fake: Impostor, desktop: Desktop) -> None:
    """libxcb would queue every event forever: the relay drops them, and ends a flood."""
    capturer = Capturer(fake.name, desktop.x_connection)
    try:
        capturer.grab(0, 0, 64, 64)
        flood = events(1_000_000)
        with measured(), pytest.raises(DesktopFailed, match="more than 10000 events"):
            fake.attack(flood)
            _until_raises(lambda: capturer.grab(0, 0, 64, 64))  # the relay's thread finds out
    finally:
        capturer.close()


# -- a whole desktop ----------------------------------------------------------------------


def test_desktop_fails_alone_and_the_real_one_carries_on(fake: Impostor, desktop: Desktop) -> None:
    hostile = Desktop(fake.name)
    try:
        hostile.perform(a.Screenshot())
        assert len(fake.links) >= 3  # input, RECORD and capture connections, all relayed
        with measured(), pytest.raises(DesktopFailed, match=rf"sent a 300 MiB event {LIMIT}"):
            fake.attack(generic_event(ATTACK), filler=ATTACK)
            hostile.run([a.Screenshot()])
        with pytest.raises(DesktopFailed):
            hostile.perform(a.CursorPosition())
    finally:
        hostile.close()
    started = time.monotonic()
    for _ in range(10):
        desktop.perform(a.Screenshot())
    assert time.monotonic() - started < 2.0
