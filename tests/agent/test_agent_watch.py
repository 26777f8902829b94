"""The agent's ``watch`` call: a frame only when the screen changed (DAMAGE), on a thread
and X connection of its own. The real agent drives a real Xvfb + openbox (no browser);
the test changes the screen as any X client would, by drawing on the root window."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from Xlib import X
from Xlib.display import Display

from deskbox_server.agent import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.errors import AgentFailed, DesktopFailed, InvalidAction
from deskbox_server.media import EncodedImage
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import Size

from ..local_desktop import HostDesktop
from .conftest import scripted_agent, start_desktop_agent, stop_agent
from .desk_page import decode
from .test_agent_desktop import start_xserver

WIDTH, HEIGHT = 1280, 800
BOX = (400, 300, 200, 100)  # x, y, width, height of what the tests draw


@pytest.fixture(scope="module")
def local() -> Iterator[HostDesktop]:
    with HostDesktop(browser=False) as desktop:
        yield desktop


@pytest.fixture(scope="module")
def watch_socket(local: HostDesktop, agent_site: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("watch") / "agent.sock"
    proc = start_desktop_agent(path, local.display_name, agent_site)
    yield path
    stop_agent(proc)


@pytest_asyncio.fixture(loop_scope="function")
async def desk(watch_socket: Path) -> AsyncIterator[AgentDesktop]:
    client = await AgentClient.connect_unix(str(watch_socket))
    try:
        yield AgentDesktop(client)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def x(local: HostDesktop) -> Iterator[Display]:
    connection = Display(local.display_name)
    yield connection
    connection.close()


def draw(x: Display, rgb: tuple[int, int, int]) -> None:
    """Fill the box on the root window (TrueColor: the pixel is 0xRRGGBB)."""
    root = x.screen().root
    gc = root.create_gc(foreground=rgb[0] << 16 | rgb[1] << 8 | rgb[2],
                        subwindow_mode=X.IncludeInferiors)
    root.fill_rectangle(gc, *BOX)
    gc.free()
    x.sync()


def box_colour(image: EncodedImage) -> tuple[int, int, int]:
    pixel = decode(image).getpixel((BOX[0] + BOX[2] // 2, BOX[1] + BOX[3] // 2))
    assert isinstance(pixel, tuple)
    return pixel[0], pixel[1], pixel[2]


def near(found: tuple[int, int, int], wanted: tuple[int, int, int]) -> bool:
    return all(abs(f - w) <= 24 for f, w in zip(found, wanted, strict=True))  # JPEG


async def test_the_first_watch_and_now_answer_the_screen_at_once(desk: AgentDesktop) -> None:
    started = time.monotonic()
    first = await desk.watch(10, 60)
    assert first is not None and first.media_type == "image/jpeg"
    assert decode(first).size == (WIDTH, HEIGHT)
    now = await desk.watch(10, 90, now=True)
    assert now is not None and decode(now).size == (WIDTH, HEIGHT)
    assert time.monotonic() - started < 3


async def test_a_still_screen_answers_no_image(desk: AgentDesktop) -> None:
    await desk.watch(1, 60, now=True)  # whatever changed before is in this frame
    started = time.monotonic()
    assert await desk.watch(0.3, 60) is None
    assert 0.3 <= time.monotonic() - started < 2


async def test_a_change_answers_at_once_with_its_pixels(desk: AgentDesktop, x: Display,
                                                        ) -> None:
    draw(x, (0, 0, 255))
    before = await desk.watch(1, 90, now=True)
    assert before is not None and near(box_colour(before), (0, 0, 255))
    # A watch that waits, then the screen changes: it answers as soon as it did.
    waiting = asyncio.ensure_future(desk.watch(10, 90))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    drawn = time.monotonic()
    draw(x, (255, 0, 0))
    after = await waiting
    assert time.monotonic() - drawn < 1
    assert after is not None and near(box_colour(after), (255, 0, 0))
    # A change between two calls: the next call answers at once.
    draw(x, (0, 255, 0))
    started = time.monotonic()
    again = await desk.watch(10, 90)
    assert time.monotonic() - started < 1
    assert again is not None and near(box_colour(again), (0, 255, 0))
    assert await desk.watch(0.2, 90) is None


async def test_a_given_up_watch_holds_up_neither_the_next_nor_the_desktop(
    desk: AgentDesktop,
) -> None:
    await desk.watch(1, 60, now=True)
    waiting = asyncio.ensure_future(desk.watch(30, 60))
    await asyncio.sleep(0.2)
    # The desktop's worker is free meanwhile.
    assert (await desk.run([a.ScreenSize()])).results == [Size(width=WIDTH, height=HEIGHT)]
    waiting.cancel()  # the host resets its stream: the agent ends the wait
    with pytest.raises(asyncio.CancelledError):
        await waiting
    started = time.monotonic()
    assert await desk.watch(0.2, 60) is None
    assert time.monotonic() - started < 1.5  # not queued behind the 30 s wait


@pytest.mark.parametrize(("args", "message"), [
    ({"timeout_s": 0}, r"^timeout_s must be in \(0, 60.0\]"),
    ({"timeout_s": 61}, r"^timeout_s must be in"),
    ({"timeout_s": True}, r"^timeout_s must be in"),
    ({"quality": 0}, r"^quality must be an integer in \[1, 100\]"),
    ({"quality": 50.5}, r"^quality must be an integer"),
    ({"now": 1}, r"^now must be true or false"),
    ({"fps": 5}, r"^unknown field 'fps'"),
])
async def test_the_agent_refuses_a_malformed_watch_by_field(
    desk: AgentDesktop, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidAction, match=message):
        await desk._call("watch", args, 5, 1 << 20, stall_fails=False)


async def test_a_killed_x_server_is_desktop_failed_and_a_new_one_is_watched(
    agent_site: Path, tmp_path: Path,
) -> None:
    with HostDesktop(browser=False) as other:
        proc = start_desktop_agent(tmp_path / "a.sock", other.display_name, agent_site)
        client = await AgentClient.connect_unix(str(tmp_path / "a.sock"))
        again: subprocess.Popen[bytes] | None = None
        try:
            desk = AgentDesktop(client)
            assert await desk.watch(1, 60) is not None
            waiting = asyncio.ensure_future(desk.watch(10, 60))
            await asyncio.sleep(0.2)
            xserver = next(c.popen for c in other.processes.children if c.name == "Xvfb")
            os.kill(xserver.pid, signal.SIGKILL)
            xserver.wait()
            started = time.monotonic()
            with pytest.raises(DesktopFailed, match="the desktop failed: lost the X connection"):
                await waiting
            assert time.monotonic() - started < 2  # the wait ends with the connection
            with pytest.raises(DesktopFailed, match="cannot connect to X display"):
                await desk.watch(1, 60)
            # The desktop's own connection learns of it at its next X request (info
            # makes none); then it connects afresh too, and info has the new size.
            with pytest.raises(DesktopFailed):
                await desk.run([a.CursorPosition()])
            again = start_xserver(int(other.display_name[1:]), 1024, 768)
            assert (await desk.info()).width == 1024
            image = await desk.watch(1, 60)
            assert image is not None and decode(image).size == (1024, 768)
        finally:
            await client.close()
            stop_agent(proc)
            if again is not None:
                again.kill()
                again.wait()


# -- a hostile agent's answers -------------------------------------------------------------

HOSTILE_WATCH = """
import json, os, struct, sys
from deskbox_agent import __main__ as m
from deskbox_agent.registry import Blob

MODE = os.environ["HOSTILE_MODE"]
JPEG = b"\\xff\\xd8\\xff" + b"\\0" * 100


async def info(args):
    return {"display": ":9", "width": 1280, "height": 800, "capture": "xshm"}


async def watch(args):
    image = {"type": "image", "media_type": "image/jpeg", "width": 1280, "height": 800,
             "offset": 0, "length": len(JPEG)}
    data = JPEG
    if MODE == "wrong_size":
        image["width"] = 640
    elif MODE == "png":
        image["media_type"] = "image/png"
    elif MODE == "not_jpeg":
        data = b"\\x89PNG" + JPEG[4:]
    elif MODE == "changed_without_image":
        image = None
    elif MODE == "too_large":
        data = JPEG + b"\\0" * (1280 * 800 * 4 + 64 * 1024)
        image["length"] = len(data)
    head = json.dumps({"changed": True, "image": image}).encode()
    return Blob(struct.pack(">I", len(head)) + head + data, "application/vnd.deskbox.parts")


registry = m.default_registry()
registry.register("info", info)
registry.register("watch", watch)
m.default_registry = lambda: registry
sys.exit(m.main(sys.argv[1:]))
"""


@pytest.fixture
def hostile_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    with scripted_agent(HOSTILE_WATCH, request.param, tmp_path / "hostile.sock") as socket_path:
        yield socket_path


@pytest.mark.parametrize(("hostile_socket", "reason"), [
    ("wrong_size", r"watch: image: not the 1280x800 image/jpeg asked for"),
    ("png", r"watch: image: not the 1280x800 image/jpeg asked for"),
    ("not_jpeg", r"watch: image: the bytes are not image/jpeg"),
    ("changed_without_image", r"watch: not \{changed, image\}"),
    ("too_large", r"watch: image: 4161639 bytes at 0 \(at most 4161536"),
], indirect=["hostile_socket"])
async def test_a_malformed_watch_reply_fails_the_agent(hostile_socket: Path, reason: str,
                                                       ) -> None:
    client = await AgentClient.connect_unix(str(hostile_socket))
    try:
        desk = AgentDesktop(client)
        with pytest.raises(AgentFailed, match=reason):
            await desk.watch(1, 60)
        with pytest.raises(AgentFailed):  # the connection is done for
            await desk.info()
    finally:
        await client.close()
