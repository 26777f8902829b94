"""The agent drives its own desktop: a real Xvfb + openbox + Chromium on this host, the real
agent (``python -m deskbox_agent --display :N``) as a subprocess with its pinned wheels,
and the host's ``AgentDesktop`` over the real protocol. The page's DOM is read through
DevTools, so every test checks what the page received, not what we sent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from deskbox_agent.desktop.service import IDLE_TRIM_S
from deskbox_server.agent import AgentClient
from deskbox_server.agent import desktop as desktop_module
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.engines.desktop_commands import DesktopSpec, xserver_argv
from deskbox_server.errors import DesktopFailed, InvalidAction, Timeout
from deskbox_server.media import EncodedImage, encode
from deskbox_server.schemas import actions as a
from deskbox_server.schemas.results import ClipboardText, Point, Size

from ..cdp_page import CdpPage
from ..local_desktop import HostDesktop
from .conftest import AGENT_DIR, start_desktop_agent, stop_agent
from .desk_page import Page, colours, decode

# -- input ---------------------------------------------------------------------------------


async def test_a_click_lands_where_it_was_aimed(page: Page) -> None:
    x, y = page.at(500, 450)
    await page.desk.perform(a.Click(x=x, y=y))
    clicks = await page.wait_for("click", 1)
    assert [(c["clientX"], c["clientY"], c["button"]) for c in clicks] == [(500, 450, 0)]


async def test_200_back_to_back_clicks_all_land(page: Page) -> None:
    for i in range(200):
        x, y = page.at(420 + i % 50 * 10, 320 + i // 50 * 20)
        await page.desk.perform(a.Click(x=x, y=y))
    clicks = await page.wait_for("click", 200, timeout_s=10)
    assert len(clicks) == 200
    # Every click lands on one of the points aimed at. Which one: Chromium may give a click
    # the position of a later move when they come faster than it reads them (so does the
    # host-side driver), so the exact sequence is not checked here.
    aimed = {(420 + i % 50 * 10, 320 + i // 50 * 20) for i in range(200)}
    assert {(c["clientX"], c["clientY"]) for c in clicks} <= aimed


async def test_typing_ascii_and_unicode_reaches_the_dom_exactly(page: Page) -> None:
    await page.focus_field()
    text = "Hello, World! 123 ~`@#$%^&*()_+{}|:\"<>? Ñandú 中文字 😀 ok"
    await page.desk.run([a.TypeText(text=text)])
    await page.until(f"document.getElementById('field').value === {text!r}")
    assert page.value() == text


async def test_every_line_break_is_typed_whatever_its_spelling(page: Page) -> None:
    """A lone carriage return (old Mac text, or a model that ends a line with it) was
    dropped: "b\\rc" came out "bc". Each of \\n, \\r\\n and \\r is one Return."""
    await page.focus_field()
    await page.desk.run([a.TypeText(text="a\r\nb\rc\nd\r")])
    expected = "a\nb\nc\nd\n"
    await page.until(f"document.getElementById('field').value === {expected!r}")
    assert page.value() == expected


async def test_concurrent_batches_run_one_at_a_time_in_order(page: Page) -> None:
    await page.focus_field()
    # The first batch waits before it types: the second, sent while it waits, must not
    # overtake it (one worker thread and a lock per desktop).
    first = asyncio.ensure_future(page.desk.run([a.Wait(ms=300), a.TypeText(text="first ")]))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(page.desk.run([a.TypeText(text="second")]))
    await asyncio.gather(first, second)
    await page.until("document.getElementById('field').value === 'first second'")


async def test_a_quick_click_waits_its_turn_behind_a_running_batch(page: Page) -> None:
    # A lone click runs on the agent's event loop, not its worker thread: sent while a
    # batch waits on the worker, it must still reach the page after that batch's key.
    await page.focus_field()
    batch = asyncio.ensure_future(page.desk.run([a.Wait(ms=300), a.TypeText(text="k")]))
    await asyncio.sleep(0.05)
    x, y = page.at(500, 450)
    await page.desk.perform(a.Click(x=x, y=y))
    await batch
    events = await page.until_events(
        lambda found: any(e["type"] == "click" for e in found))
    order = [e["type"] for e in events if e["type"] in ("keydown", "mousedown")]
    assert order == ["keydown", "mousedown"]
    assert page.value() == "k"


async def test_a_call_given_up_keeps_the_desktop_until_its_work_ends(page: Page) -> None:
    """The host gives a batch up (its deadline) while the worker still runs it: the lone
    click after it once ran on the event loop beside that batch, into the middle of its
    drag or held keys, since the cancelled call let the desktop go at once."""
    await page.focus_field()
    request = {"actions": [{"type": "wait", "ms": 1000}, {"type": "type", "text": "k"}],
               "view": None, "screenshot": None, "settle": page.desk._settle_json()}
    with pytest.raises(Timeout):
        await page.desk._client.call("act", request, timeout_s=0.2)
    x, y = page.at(500, 450)
    await page.desk.perform(a.Click(x=x, y=y))
    events = await page.until_events(
        lambda found: any(e["type"] == "click" for e in found))
    order = [e["type"] for e in events if e["type"] in ("keydown", "mousedown")]
    assert order == ["keydown", "mousedown"]
    assert page.value() == "k"


async def test_keys_and_combos(page: Page) -> None:
    await page.focus_field()
    await page.desk.run([a.TypeText(text="abc def"), a.Key(keys="ctrl+a"),
                         a.TypeText(text="x"), a.Key(keys="BackSpace"), a.TypeText(text="yz"),
                         a.Key(keys="shift+Left"), a.Key(keys="Delete")])
    await page.until("document.getElementById('field').value === 'y'")
    assert any(e["key"] == "a" and e["ctrl"] for e in page.events("keydown"))


async def test_scroll_reaches_the_page(page: Page) -> None:
    x, y = page.at(700, 450)
    await page.desk.run([a.Scroll(x=x, y=y, dy=3), a.Scroll(dx=-2)])
    await page.until("window.__events.some(e => e.type === 'wheel' && e.deltaX < 0)")
    wheels = page.events("wheel")
    # Chromium may merge notches that arrive together into one event with a larger delta.
    assert [w["deltaY"] > 0 for w in wheels if w["deltaY"]] == [True] * len(
        [w for w in wheels if w["deltaY"]]) != []
    assert all(w["deltaX"] <= 0 for w in wheels)
    assert all((w["clientX"], w["clientY"]) == (700, 450) for w in wheels)


async def test_drag_presses_moves_and_releases(page: Page) -> None:
    path = [page.at(450, 350), page.at(550, 400), page.at(650, 450)]
    await page.desk.run([a.Drag(path=path)])
    ups = await page.wait_for("mouseup", 1)
    downs, moves = page.events("mousedown"), page.events("mousemove")
    assert (downs[0]["clientX"], downs[0]["clientY"]) == (450, 350)
    assert (ups[0]["clientX"], ups[0]["clientY"]) == (650, 450)
    assert any((m["clientX"], m["clientY"]) == (550, 400) and m["buttons"] == 1 for m in moves)


async def test_cursor_position_is_in_the_views_space(page: Page) -> None:
    view = a.CoordinateSpace(width=640, height=400)
    result = await page.desk.run([a.Move(x=100, y=50), a.CursorPosition(), a.ScreenSize()],
                                 view)
    assert result.results[1:] == [Point(x=100, y=50), Size(width=640, height=400)]
    screen = await page.desk.run([a.CursorPosition(), a.ScreenSize()])
    assert screen.results == [Point(x=200, y=100), Size(width=1280, height=800)]


async def test_clipboard_set_and_get(desk: AgentDesktop) -> None:
    text = "Deskbox héllo 中文 😀\nline 2"
    result = await desk.run([a.ClipboardSet(text=text), a.ClipboardGet()])
    assert result.results == [None, ClipboardText(text=text)]


# -- screenshots ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
async def test_a_screenshot_decodes_and_shows_the_page(page: Page, fmt: str) -> None:
    result = await page.desk.run([], screenshot=a.Screenshot(format=fmt))  # type: ignore[arg-type]
    assert result.screenshot is not None and result.settled
    image = decode(result.screenshot)
    assert image.size == (1280, 800)
    assert len(image.getcolors(1 << 20) or []) > 16  # a page, not a flat colour
    red = image.getpixel(page.at(200, 150))
    green = image.getpixel(page.at(500, 150))
    assert isinstance(red, tuple) and isinstance(green, tuple)
    assert red[0] > 200 and red[1] < 60 and red[2] < 60
    assert green[1] > 200 and green[0] < 60 and green[2] < 60


async def test_a_focused_text_field_looks_the_same_in_every_screenshot(page: Page) -> None:
    """The caret does not blink (the GTK settings every desktop's browser reads): looks at
    one state 0.3 s apart over 1.5 s are the same picture, the caret in it. A blinking
    caret toggles every 0.5 s, so some of these would differ."""
    await page.focus_field()
    await page.desk.perform(a.TypeText(text="caret"))
    await page.until("document.getElementById('field').value === 'caret'")
    await asyncio.sleep(0.2)
    looks = []
    for _ in range(6):
        looks.append((await page.desk.capture("png")).data)
        await asyncio.sleep(0.3)
    assert len(set(looks)) == 1, f"{len(set(looks))} different pictures of one state"
    field = decode(await page.desk.capture("png")).crop((*page.at(700, 100), *page.at(1100, 250)))
    assert len(colours(field)) > 2  # the text and the caret are in it


async def test_a_marked_screen_skips_a_repaint_but_never_a_change(page: Page) -> None:
    """``mark`` (sent before a checkpoint) lets the next look take damage that left every
    pixel as marked for a repaint; damage that changed pixels is waited out and shown."""
    x, y = page.at(200, 150)  # the red box, under the cover
    look = [a.Screenshot(format="png")]

    def cover(colour: str) -> None:
        page.cdp.evaluate(
            "(() => { const d = document.getElementById('cover') || document.body.appendChild("
            "Object.assign(document.createElement('div'), {id: 'cover'}));"
            f"d.style.cssText = 'position:fixed;inset:0;z-index:99;background:{colour}'; }})()")
        page.cdp.wait_painted()

    try:
        await page.desk.mark()
        cover("rgb(0, 0, 255)")
        changed = await page.desk.run(look)
        assert changed.settled and isinstance(shot := changed.results[0], EncodedImage)
        assert decode(shot).getpixel((x, y)) == (0, 0, 255)

        await page.desk.mark()  # two changes that end where they began: a repaint
        cover("rgb(0, 255, 0)")
        cover("rgb(0, 0, 255)")
        same = await page.desk.run(look)
        assert same.settled and isinstance(shot := same.results[0], EncodedImage)
        assert decode(shot).getpixel((x, y)) == (0, 0, 255)
    finally:
        page.cdp.evaluate("document.getElementById('cover')?.remove()")
        page.cdp.wait_painted()


async def test_a_page_that_changes_by_itself_is_never_shown_as_it_was(page: Page) -> None:
    """A look at an unchanged screen reuses the last look's bytes (the agent's Desktop);
    a page that repaints on a timer, with no action in between, is shown as it is now."""
    x, y = page.at(200, 150)
    look = a.Screenshot(format="jpeg", quality=90)
    page.cdp.evaluate(
        "(() => { const d = document.body.appendChild(Object.assign("
        "document.createElement('div'), {id: 'cover'}));"
        "d.style.cssText = 'position:fixed;inset:0;z-index:99;background:rgb(0,0,255)';"
        "setTimeout(() => { d.style.background = 'rgb(255,255,0)'; }, 400); })()")
    try:
        page.cdp.wait_painted()
        shots = [(await page.desk.run([], screenshot=look)).screenshot for _ in range(3)]
        assert all(s is not None and s.data == shots[0].data for s in shots)  # type: ignore[union-attr]
        assert shots[0] is not None
        blue = decode(shots[0]).getpixel((x, y))
        assert isinstance(blue, tuple) and blue[2] > 200 and blue[0] < 40
        await asyncio.sleep(0.6)
        later = (await page.desk.run([], screenshot=look)).screenshot
        assert later is not None
        yellow = decode(later).getpixel((x, y))
        assert isinstance(yellow, tuple) and yellow[0] > 200 and yellow[1] > 200 and yellow[2] < 60
    finally:
        page.cdp.evaluate("document.getElementById('cover')?.remove()")
        page.cdp.wait_painted()


async def test_region_scale_view_and_zoom(page: Page) -> None:
    rx, ry = page.at(100, 100)
    region = a.Region(x=rx, y=ry, width=200, height=100)
    view = a.CoordinateSpace(width=640, height=400)
    result = await page.desk.run([
        a.Screenshot(format="png", region=region),
        a.Screenshot(format="jpeg", scale=a.ScaleTo(width=320, height=200)),
        a.Zoom(region=a.Region(x=rx // 2, y=ry // 2, width=100, height=50)),
    ])
    shot, scaled, _ = result.results
    assert isinstance(shot, EncodedImage) and isinstance(scaled, EncodedImage)
    pixels = decode(shot)
    assert pixels.size == (200, 100)
    assert colours(pixels) == {(255, 0, 0)}  # the red box, exactly
    assert decode(scaled).size == (320, 200)
    inside = page.at(150, 120)  # well inside the red box, whatever the rounding
    in_view = await page.desk.run(
        [a.Zoom(region=a.Region(x=inside[0] // 2, y=inside[1] // 2, width=40, height=20))],
        view,
        screenshot=a.Screenshot(format="png"))
    zoom = in_view.results[0]
    assert isinstance(zoom, EncodedImage) and in_view.screenshot is not None
    assert decode(zoom).size == (80, 40)  # the screen's own pixels: 2x the view's
    assert colours(decode(zoom)) == {(255, 0, 0)}
    assert decode(in_view.screenshot).size == (640, 400)


async def test_the_edges_of_a_view_far_larger_than_the_screen(desk: AgentDesktop) -> None:
    """The last column of a view three times the screen's size rounded to the column past
    the screen's edge, whose capture X refused: the session failed."""
    view = a.CoordinateSpace(width=3840, height=2400)
    result = await desk.run([
        a.Zoom(region=a.Region(x=3839, y=0, width=1, height=2400)),
        a.Zoom(region=a.Region(x=0, y=2399, width=3840, height=1)),
    ], view)
    column, row = result.results
    assert isinstance(column, EncodedImage) and isinstance(row, EncodedImage)
    assert decode(column).size == (1, 800) and decode(row).size == (1280, 1)


async def test_a_webp_past_the_formats_bound_is_refused_and_the_desktop_goes_on(
    desk: AgentDesktop,
) -> None:
    """WebP has at most 16383 pixels a side, the API's sizes 16384: a 500 before."""
    with pytest.raises(InvalidAction, match="WebP image is at most 16383 pixels a side"):
        await desk.run([a.Screenshot(format="webp", scale=a.ScaleTo(width=16384, height=100))])
    assert (await desk.run([a.ScreenSize()])).results == [Size(width=1280, height=800)]


async def test_a_batch_whose_reply_would_not_fit_in_memory_is_refused(page: Page) -> None:
    """Its reply is built whole in the agent: a thousand looks at a photo-like page (here
    noise, ~3 MB a PNG), or scaled up, took gigabytes and the agent was killed for memory."""
    page.cdp.evaluate(
        "(() => { const c = document.createElement('canvas'); c.width = innerWidth;"
        " c.height = innerHeight; c.style = 'position:fixed;left:0;top:0;z-index:9';"
        " const x = c.getContext('2d'), d = x.createImageData(c.width, c.height);"
        " const w = new Uint32Array(d.data.buffer); let s = 7;"
        " for (let i = 0; i < w.length; i++) { s ^= s << 13; s ^= s >>> 17; s ^= s << 5;"
        " w[i] = s | 0xff000000; }"
        " x.putImageData(d, 0, 0); document.body.append(c); })()")
    await asyncio.sleep(0.5)
    with pytest.raises(InvalidAction, match=r"add up to more than 256 MiB at action \d+"):
        await page.desk.run([a.Screenshot(format="png")] * 1000)
    assert (await page.desk.run([a.ScreenSize()])).results == [Size(width=1280, height=800)]


async def test_capture_and_grab(page: Page) -> None:
    image = await page.desk.capture("png")
    assert decode(image).size == (1280, 800)
    frame = await page.desk.grab()
    assert (frame.width, frame.height) == (1280, 800)
    x, y = page.at(150, 350)
    assert tuple(frame.pixels[y, x, :3]) == (255, 0, 0)  # BGRX: the blue box
    # What a paused session does with it: the host encodes the frozen frame itself.
    frozen = decode(encode(frame.scaled(640, 400), "png", 75))
    assert frozen.size == (640, 400) and len(colours(frozen)) > 16
    info = await page.desk.info()
    assert (info.width, info.height, info.capture) == (1280, 800, "xshm")


async def test_a_deflated_grab_is_the_raw_grab_in_a_hundredth_of_the_bytes(
    desk_socket: Path,
) -> None:
    client = await AgentClient.connect_unix(str(desk_socket))
    try:
        assert "grab_deflated" in client.hello_info.calls
        raw = await client.call("grab", {})
        deflated = await client.call("grab_deflated", {})
    finally:
        await client.close()
    raw_pixels, deflated_pixels = raw.body[-1280 * 800 * 4:], deflated.body
    assert len(deflated_pixels) < len(raw_pixels) // 20
    # What the host makes of either: the same frame (the screen did not change between).
    frames = []
    for name in ("grab", "grab_deflated"):
        client = await AgentClient.connect_unix(str(desk_socket))
        try:
            if name == "grab":  # an agent without the deflated call: the host falls back
                client.hello_info = dataclasses.replace(
                    client.hello_info,
                    calls=tuple(c for c in client.hello_info.calls if c != "grab_deflated"))
            frames.append((await AgentDesktop(client).grab()).pixels)
        finally:
            await client.close()
    assert frames[0].shape == frames[1].shape == (800, 1280, 4)
    assert (frames[0][..., :3] == frames[1][..., :3]).all()


def _rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# A PNG screenshot's buffers in the agent, in a fresh process: the capture (4 MB), the PNG
# rows (3 MB), the deflated bytes and their copies. Prints the free bytes glibc keeps in its
# heap after five of them, then after the agent's idle trim.
SCREENSHOT_BUFFERS = """
import ctypes, sys
from deskbox_agent.desktop.service import _Malloc
class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
malloc = _Malloc() if sys.argv[1] == "agent" else None
def shot():
    capture = bytearray(4_096_000)
    rows = bytearray(3_072_800)
    deflated = [bytearray(400_000) for _ in range(4)]
    del capture, rows, deflated
for _ in range(5):
    shot()
kept = libc.mallinfo2().fordblks
if malloc is not None:
    malloc.trim()
print(kept, libc.mallinfo2().fordblks)
"""
MIB = 1024 * 1024


@pytest.mark.parametrize("malloc", ["agent", "glibc's defaults"])
def test_a_screenshots_buffers_stay_in_the_heap_while_busy_and_go_back_when_idle(
    agent_site: Path, malloc: str,
) -> None:
    """glibc gives a freed heap's top back to the kernel once it passes 8 MB (its threshold
    after the first 4 MB buffer), and a PNG of a page of text frees about that much: the
    next screenshot then faulted in ~1,900 fresh pages, which cost more than its encoding
    (`bench/agent_desktop.py`: 1,345 faults and 9.8 ms a screenshot, then none and 6.2
    ms). The agent's malloc keeps them while it is busy; its idle trim gives them back."""
    env = {**os.environ, "PYTHONPATH": f"{AGENT_DIR}{os.pathsep}{agent_site}"}
    done = subprocess.run([sys.executable, "-c", SCREENSHOT_BUFFERS, malloc], env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    kept, after_trim = (int(field) for field in done.stdout.split())
    if malloc == "agent":
        assert kept > 8 * MIB and after_trim < MIB, done.stdout
    else:  # what the agent had before: a heap trimmed after every screenshot
        assert kept < MIB, done.stdout


TEXT_PAGE = "data:text/html," + quote(
    "<body style='font:13px serif;columns:3'>"
    + "".join(f"<p>{i} " + " ".join(f"word{(i * 31 + j) % 97}" for j in range(70)) + "</p>"
              for i in range(40)) + "</body>")


@contextlib.asynccontextmanager
async def busy_agent(host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage,
                     tmp_path: Path) -> AsyncIterator[tuple[AgentDesktop, int]]:
    """A fresh agent that just took PNGs of a page of text (its heap keeps their buffers),
    and its pid."""
    cdp.navigate(TEXT_PAGE)
    cdp.wait_painted("data:")
    proc = start_desktop_agent(tmp_path / "a.sock", host_desktop.display_name, agent_site)
    client = await AgentClient.connect_unix(str(tmp_path / "a.sock"))
    try:
        desk = AgentDesktop(client)
        shots = [await desk.capture("png") for _ in range(5)]
        assert len(shots[-1].data) > 150_000  # a screen of text, not a blank one
        yield desk, proc.pid
    finally:
        await client.close()
        stop_agent(proc)


async def test_an_idle_agent_gives_a_screenshots_memory_back(
    host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage, tmp_path: Path,
) -> None:
    """Busy, the agent keeps a screenshot's buffers (above); what gives them back is its
    trim once the desktop has had no call for a moment: an idle session holds none."""
    async with busy_agent(host_desktop, agent_site, cdp, tmp_path) as (_, pid):
        busy = _rss(pid)
        await asyncio.sleep(IDLE_TRIM_S + 1.5)
        assert _rss(pid) < busy - 4 * MIB, busy  # the buffers went back


async def test_a_mark_gives_a_screenshots_memory_back_before_the_checkpoint(
    host_desktop: HostDesktop, agent_site: Path, cdp: CdpPage, tmp_path: Path,
) -> None:
    """The host marks the screen right before it checkpoints the sandbox: memory the agent
    kept for its next screenshots goes back then, not 2 s later, or the checkpoint would
    dump it (a hibernation of a page of text 180 → 171 MiB, its resume 0.60 → 0.48 s)."""
    async with busy_agent(host_desktop, agent_site, cdp, tmp_path) as (desk, pid):
        busy = _rss(pid)
        await desk.mark()
        assert _rss(pid) < busy - 4 * MIB, busy


async def test_ready_with_and_without_a_browser(desk: AgentDesktop) -> None:
    timings = await desk.ready(browser=True, timeout_s=10)
    assert list(timings) == ["xserver", "wm", "browser", "painted"]
    assert all(0 <= t < 10 for t in timings.values())
    assert list(await desk.ready(browser=False, timeout_s=10)) == ["xserver", "wm"]


async def test_a_ready_longer_than_one_agent_call_asks_again(
    agent_site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start timeout past the agent's 300 s per ``ready`` (a slow host's setting) is
    waited out in several calls, not refused."""
    with HostDesktop(browser=False) as local:
        proc = start_desktop_agent(tmp_path / "a.sock", local.display_name, agent_site)
        client = await AgentClient.connect_unix(str(tmp_path / "a.sock"))
        try:
            desk = AgentDesktop(client)
            assert list(await desk.ready(browser=False, timeout_s=1000)) == ["xserver", "wm"]
            monkeypatch.setattr(desktop_module, "MAX_READY_CALL_S", 0.4)
            started = time.monotonic()
            with pytest.raises(Timeout, match="waiting for the browser window"):
                await desk.ready(browser=True, timeout_s=1.5)
            assert 1.4 < time.monotonic() - started < 4  # past the first call's 0.4 s
        finally:
            await client.close()
            stop_agent(proc)


# -- refusals and failures -----------------------------------------------------------------


async def test_a_bad_action_is_invalid_action_with_a_clear_message(desk: AgentDesktop) -> None:
    with pytest.raises(InvalidAction, match=r"point \(5000, 10\) is outside the 1280x800"):
        await desk.run([a.Click(x=5000, y=10)])
    with pytest.raises(InvalidAction, match="unknown key name 'notakey'"):
        await desk.run([a.Key(keys="ctrl+notakey")])
    # What the host's schema would refuse, sent raw: the agent refuses it too, by field.
    with pytest.raises(InvalidAction, match=r"actions\[1\]: count must be an integer in"):
        await desk._call("act", {"actions": [{"type": "wait", "ms": 0},
                                             {"type": "click", "count": 9}]}, 5, 1 << 20)
    with pytest.raises(InvalidAction, match=r"actions\[0\]: type must be one of"):
        await desk._call("act", {"actions": [{"type": "explode"}]}, 5, 1 << 20)
    assert (await desk.run([a.ScreenSize()])).results == [Size(width=1280, height=800)]


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"actions": "nope"}, r"^actions must be a list of at most 1000 actions"),
        ({"actions": [{"type": "click", "x": True, "y": 1}]},
         r"^actions\[0\]: x must be an integer in \[0, 16384\]"),
        ({"actions": [{"type": "type", "text": "a", "extra": 1}]},
         r"^actions\[0\]: unknown field 'extra'"),
        ({"actions": [{"type": "drag", "path": [[0, 0]] * 10001}]},
         r"^actions\[0\]: path must be a list of 2 to 10000 points"),
        ({"actions": [{"type": "drag", "path": [[0, 0], [1, -1]]}]},
         r"^actions\[0\]\.path\[1\]: a point is \[x, y\]"),
        ({"actions": [{"type": "hold_key", "keys": "a", "duration_s": float("nan")}]},
         r"^actions\[0\]: duration_s must be a number in \[0.0, 30.0\]"),
        ({"actions": [{"type": "wait"}]}, r"^actions\[0\]: ms is required"),
        ({"actions": [{"type": "zoom", "region": {"x": 0, "y": 0, "width": 0, "height": 1}}]},
         r"^actions\[0\]\.region: width must be an integer in \[1, 16384\]"),
        ({"actions": [], "view": {"width": 7681, "height": 4321}},
         r"^view: 7681x4321 is more than 33177600 pixels"),
        ({"actions": [], "settle": {"quiet_s": 11}},
         r"^settle: quiet_s must be a number in \[0.0, 10.0\]"),
        ({"actions": [], "screenshot": {"format": "gif"}},
         r"^screenshot: format must be one of png, jpeg, webp"),
        ({"actions": [], "colour": "red"}, r"^unknown field 'colour'"),
    ],
)
async def test_the_agent_refuses_a_malformed_act_by_field(
    desk: AgentDesktop, request_body: dict[str, Any], message: str
) -> None:
    """What the host's schema refuses never reaches the agent; sent raw, it is refused there
    too, naming the field, and the desktop goes on."""
    with pytest.raises(InvalidAction, match=message):
        await desk._call("act", request_body, 5, 1 << 20)
    assert (await desk.run([a.ScreenSize()])).results == [Size(width=1280, height=800)]


# The first call after the X server died: a batch (the worker thread) or a lone click
# (the agent's event loop): either fails with the reason, and the next call connects afresh.
@pytest.mark.parametrize("first", [
    [a.Move(x=1, y=1), a.CursorPosition()], [a.Click(x=1, y=1)]], ids=["batch", "click"])
async def test_a_killed_x_server_is_desktop_failed_and_a_new_one_is_used(
    agent_site: Path, tmp_path: Path, first: list[a.Action]
) -> None:
    with HostDesktop(browser=False) as local:
        proc = start_desktop_agent(tmp_path / "a.sock", local.display_name, agent_site)
        client = await AgentClient.connect_unix(str(tmp_path / "a.sock"))
        again: subprocess.Popen[bytes] | None = None
        try:
            desk = AgentDesktop(client)
            assert (await desk.run([a.ScreenSize()])).results[0] == Size(width=1280, height=800)
            # No browser on this desktop: ready says what did not come, in time.
            started = time.monotonic()
            with pytest.raises(Timeout, match="waiting for the browser window"):
                await desk.ready(browser=True, timeout_s=0.5)
            assert time.monotonic() - started < 3
            xserver = next(c.popen for c in local.processes.children if c.name == "Xvfb")
            os.kill(xserver.pid, signal.SIGKILL)
            xserver.wait()
            with pytest.raises(DesktopFailed, match="the desktop failed"):
                await desk.run(first)
            with pytest.raises(DesktopFailed, match="cannot connect to X display"):
                await desk.run([a.CursorPosition()])
            assert await client.health() > 0  # the agent itself goes on
            # An X server on the same display again: the next call connects to it.
            again = start_xserver(int(local.display_name[1:]), 1024, 768)
            assert (await desk.info()).width == 1024
            assert (await desk.run([a.ScreenSize()])).results[0] == Size(width=1024, height=768)
        finally:
            await client.close()
            stop_agent(proc)
            if again is not None:
                again.kill()
                again.wait()


def start_xserver(display: int, width: int, height: int) -> subprocess.Popen[bytes]:
    """Xvfb on ``:display``, returned once it accepts connections (it says so on -displayfd)."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as ready:
        try:
            proc = subprocess.Popen(
                xserver_argv(DesktopSpec(width=width, height=height), write_fd, display),
                pass_fds=[write_fd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            os.close(write_fd)
        number = ready.readline().strip()
    if number != str(display).encode():
        proc.kill()
        proc.wait()
        raise AssertionError(f"Xvfb did not start on :{display} ({number!r})")
    return proc
