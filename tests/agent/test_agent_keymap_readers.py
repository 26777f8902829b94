"""The first character off the layout in an agent's life: the clients that re-read a changed
layout are learned in the background once the browser is ready, so that lending it a
keycode waits only for them (~15 ms a `type`, ~155 ms when they are learned on the spot);
a client that connected since is still waited for, and keys sent while the learning runs
(a client reads the keymap for them, not to follow the change) make the first lending
learn on the spot instead of waiting for that client from then on. Each test starts an
agent of its own on the module's desktop (Xvfb, openbox, Chromium), since what it learns
lasts its life."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from Xlib import X
from Xlib import display as xdisplay

from deskbox_server.agent import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.schemas import actions as a

from ..cdp_page import CdpPage
from ..local_desktop import HostDesktop
from .conftest import start_desktop_agent, stop_agent
from .desk_page import Page

# The clients' re-reads of the table written at `ready` take a few ms, then 0.1 s of quiet.
LEARNED_S = 0.5
# Re-reads of that table count for 1 s after it.
LEARNING_OVER_S = 1.3
# A lending that waits for a client that never re-reads waits its whole bound, 1 s.
NO_TIMEOUT_S = 0.5


@contextlib.asynccontextmanager
async def _fresh_page(host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage,
                      socket_path: Path) -> AsyncIterator[Page]:
    """The event page driven by an agent that has never changed the layout."""
    proc = start_desktop_agent(socket_path, host_desktop.display_name, agent_site)
    try:
        client = await AgentClient.connect_unix(str(socket_path))
        try:
            page = Page(AgentDesktop(client), cdp)
            await page.load()
            await page.focus_field()
            yield page
        finally:
            await client.close()
    finally:
        stop_agent(proc)


@pytest_asyncio.fixture(loop_scope="function")
async def fresh_page(host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage,
                     tmp_path: Path) -> AsyncIterator[Page]:
    async with _fresh_page(host_desktop, agent_site, cdp, tmp_path / "fresh.sock") as page:
        yield page


async def _first_lending_s(page: Page, char: str) -> float:
    """How long a `type` of ``char``, off the layout and never lent before, takes."""
    started = time.monotonic()
    await page.desk.perform(a.TypeText(text=char))
    elapsed_s = time.monotonic() - started
    await page.until_events(lambda _: page.value() == char)
    assert page.value() == char
    return elapsed_s


class _LateReader:
    """A client started after the agent learned: it reads the layout once, then re-reads it
    ``delay_s`` after each change (a program slower to follow than the browser)."""

    def __init__(self, display_name: str, delay_s: float) -> None:
        self._x = xdisplay.Display(display_name)
        self._delay_s = delay_s
        self._stop = threading.Event()
        self.rereads: list[float] = []
        self._read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        first = self._x.display.info.min_keycode
        self._x.get_keyboard_mapping(first, self._x.display.info.max_keycode - first + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._x.pending_events():
                time.sleep(0.005)
                continue
            if self._x.next_event().type == X.MappingNotify:
                time.sleep(self._delay_s)
                self.rereads.append(time.monotonic())
                self._read()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with contextlib.suppress(Exception):
            self._x.close()


async def test_keys_typed_while_the_learning_runs_leave_no_lending_waiting_for_nothing(
    fresh_page: Page,
) -> None:
    """Two of Chromium's connections read the keymap only when a key arrives. Typed right
    after `ready`, keys make them read it within the learning's window: taken for readers,
    every later lending waited its whole bound (1 s) for a re-read that never came. Keys end
    the window, so the first lending learns on the spot and the next ones are quick. (First
    in this module: what other agents typed before on its desktop hid this.)"""
    await fresh_page.desk.ready(browser=True, timeout_s=10)
    await fresh_page.desk.perform(a.TypeText(text="abc"))
    await asyncio.sleep(LEARNING_OVER_S)
    typed = "abc"
    for char in "ɐɑɒ":  # none lent before on this desktop
        started = time.monotonic()
        await fresh_page.desk.perform(a.TypeText(text=char))
        elapsed_s = time.monotonic() - started
        typed += char
        await fresh_page.until_events(lambda _, t=typed: fresh_page.value() == t)
        assert fresh_page.value() == typed
        assert elapsed_s < NO_TIMEOUT_S, (char, elapsed_s)


async def test_the_first_character_off_the_layout_after_ready_waits_for_no_quiet(
    host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage, tmp_path: Path,
) -> None:
    """Once the browser is ready the agent writes the layout unchanged and notes who
    re-reads it. The first lending then waits only for those clients, where one in a
    desktop nobody asked `ready` of learns on the spot and waits for their re-reads to stop
    for 0.1 s: compared on two fresh agents, under the same load."""
    async with _fresh_page(host_desktop, agent_site, cdp, tmp_path / "a.sock") as page:
        on_the_spot_s = await _first_lending_s(page, "ʘ")
    async with _fresh_page(host_desktop, agent_site, cdp, tmp_path / "b.sock") as page:
        await page.desk.ready(browser=True, timeout_s=10)
        await asyncio.sleep(LEARNED_S)
        learned_before_s = await _first_lending_s(page, "ʭ")
    assert learned_before_s < on_the_spot_s - 0.05, (learned_before_s, on_the_spot_s)


async def test_a_client_that_connected_after_the_learning_is_still_waited_for(
    fresh_page: Page, host_desktop: HostDesktop,
) -> None:
    """A program started after the agent learned (a second browser, say) is not known to
    re-read: the first lending learns on the spot, so it waits for that program's re-read
    too, as a lending before any learning would."""
    await fresh_page.desk.ready(browser=True, timeout_s=10)
    await asyncio.sleep(LEARNING_OVER_S)
    late = _LateReader(host_desktop.display_name, delay_s=0.05)
    try:
        started = time.monotonic()
        await fresh_page.desk.perform(a.TypeText(text="ʬ"))
        rereads_before_the_reply = list(late.rereads)
        await fresh_page.until_events(lambda _: fresh_page.value() == "ʬ")
        assert fresh_page.value() == "ʬ"
        assert rereads_before_the_reply, "typed before the late client had re-read the layout"
        assert rereads_before_the_reply[0] > started
    finally:
        late.close()
