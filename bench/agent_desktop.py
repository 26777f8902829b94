"""The desktop driven through deskbox-agent (issue 14), end to end from the host's side.

Run from the repository root::

    .venv/bin/python bench/agent_desktop.py [--iterations 200] [--clicks 1000]

Starts one local desktop (Xvfb + openbox + Chromium, 1280x800) and the real agent
(``python -m deskbox_agent --display :N``, with its pinned wheels from
desktop_image/agent/requirements.txt installed into a temporary directory, as the image
has them), connects the host's ``AgentDesktop`` over a unix socket, and measures, one call
at a time: screenshots (JPEG q75 and PNG, time and bytes) of two pages (the driver bench's
flat page and a page of text), a click, typing 100 characters until they are in the DOM,
and back-to-back clicks landing. Then the encoders alone, in the agent's Python, on the
same frame, and the agent's memory (PSS, from /proc/PID/smaps_rollup): idle with and
without a display, and after a screenshot. Prints markdown tables (median and p95 in ms).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # tests/ (its CdpPage and host desktop)

from api import FRESH_QUALITIES  # noqa: E402 (bench/api.py, this script's directory)

from deskbox_server.agent import AgentClient  # noqa: E402
from deskbox_server.agent.desktop import AgentDesktop  # noqa: E402
from deskbox_server.schemas import actions as a  # noqa: E402
from tests.cdp_page import CdpPage  # noqa: E402
from tests.local_desktop import HostDesktop as LocalSandbox  # noqa: E402

AGENT_DIR = ROOT / "desktop_image" / "agent"
# Where the image build keeps the agent's wheels (its state directory's wheels/).
WHEEL_CACHE = Path(os.environ.get("DESKBOX_IMAGE_STATE_DIR", "/var/cache/deskbox")) / "wheels"
TYPED = (
    "The quick brown fox jumps over the lazy dog. 0123456789 "
    "!@#$%^&*()_+-=[]{};:'\",./<>?|\\~` ABCDEFGHIJKLMN"
)[:100]
# Six characters a US layout has no key for (ü ß ç 中 文 ✓): no more than stay lent.
TYPED_OFF_LAYOUT = "Grüße, ça va? 中文 ✓"
# A Chinese sentence of 17 distinct characters off the layout: more than stay lent.
TYPED_CJK = "今天天气很好，我们一起去公园散步吧。"
# Another of 19, none of them in the first: typed after it, it takes the first's keycodes.
TYPED_CJK_OTHER = "春眠不觉晓处处闻啼鸟夜来风雨声花落知多少"
CLICK_X, CLICK_Y = 640, 400

FLAT_PAGE = """<!doctype html><html><head><meta charset="utf-8"><style>
  html, body { margin: 0; height: 100%; overflow: hidden; font: 16px sans-serif; }
  #target { position: fixed; inset: 0 0 200px 0; background: #dde7f0; user-select: none; }
  #text { position: fixed; left: 0; right: 0; bottom: 0; height: 180px; width: 100%;
          box-sizing: border-box; font: 14px monospace; }
</style></head><body><div id="target">click target</div>
<textarea id="text" spellcheck="false" autocomplete="off"></textarea>
<script>
  window.bench = { clicks: 0, expect: null, typedAt: null };
  document.getElementById("target").addEventListener("click", () => { bench.clicks += 1; });
  // The page's own clock when the text first became exactly what was typed: no poll in it.
  document.getElementById("text").addEventListener("input", (e) => {
    if (bench.typedAt === null && e.target.value === bench.expect) bench.typedAt = Date.now();
  });
  bench.resetText = () => { const t = document.getElementById("text"); t.value = "";
    bench.typedAt = null; t.focus(); return document.activeElement === t; };
</script></body></html>"""

WORDS = ("deskbox agent desktop screen capture encode settle keyboard pointer clipboard "
         "chromium openbox session sandbox protocol stream frame window damage").split()


def text_page() -> str:
    """A page of text, a table and coloured boxes: what a model mostly looks at."""
    paragraphs = "".join(
        f"<p>{' '.join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(60))}</p>"
        for i in range(12))
    rows = "".join(f"<tr><td>{i}</td><td>{WORDS[i % len(WORDS)]}</td><td>{i * 37 % 101}</td>"
                   f"<td style='background:hsl({i * 29 % 360},60%,80%)'>{i * 3.5:.1f}</td></tr>"
                   for i in range(20))
    return ("<!doctype html><html><head><meta charset='utf-8'><style>"
            "body{font:14px/1.4 serif;margin:16px;columns:2} h1{color:#235}"
            "table{border-collapse:collapse} td{border:1px solid #999;padding:2px 8px}"
            "</style></head><body><h1>Deskbox benchmark page</h1>"
            f"{paragraphs}<table>{rows}</table></body></html>")


def p95(samples: Sequence[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def pss_mib(pid: int) -> float:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    found = re.search(r"^Pss:\s+(\d+) kB", rollup, re.M)
    assert found is not None
    return int(found[1]) / 1024


def install_agent_wheels(target: Path) -> None:
    """The agent's pinned wheels, as the image installs them (the build's cache first)."""
    install = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input",
               "install", "--target", str(target), "--require-hashes", "--no-compile",
               "--only-binary=:all:", "--requirement", str(AGENT_DIR / "requirements.txt")]
    done = subprocess.run([*install, "--no-index", "--find-links", str(WHEEL_CACHE)],
                          capture_output=True, check=False)
    if done.returncode != 0:
        subprocess.run(install, capture_output=True, check=True)


def start_agent(sock: Path, site: Path, display: str | None, python: str = sys.executable,
                ) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{AGENT_DIR}{os.pathsep}{site}"}
    env.pop("DISPLAY", None)
    argv = [python, "-m", "deskbox_agent", "--listen", f"unix:{sock}"]
    proc = subprocess.Popen([*argv, "--display", display] if display else argv, env=env,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(sock))
                return proc
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    proc.kill()
                    raise RuntimeError("the agent did not start") from None
                time.sleep(0.01)


async def typing(desk: AgentDesktop, cdp: CdpPage, text: str,
                 times: int) -> tuple[list[float], list[float], list[float]]:
    """``text`` typed into the page's field ``times`` times, emptied before each: ms of the
    call, until the field holds it exactly (polled over CDP), and by the page's clock."""
    call_ms, dom_ms, page_ms = [], [], []
    cdp.evaluate(f"bench.expect = {json.dumps(text)}")
    for _ in range(times):
        assert cdp.evaluate("bench.resetText()")
        wall_ms = time.time() * 1000
        started = time.perf_counter()
        await desk.run([a.TypeText(text=text)])
        call_ms.append((time.perf_counter() - started) * 1000)
        while cdp.evaluate("document.getElementById('text').value") != text:
            if time.perf_counter() - started > 10:
                raise RuntimeError("the typed text did not reach the page")
        dom_ms.append((time.perf_counter() - started) * 1000)
        page_ms.append(float(cdp.evaluate("bench.typedAt")) - wall_ms)
    return call_ms, dom_ms, page_ms


class Row:
    def __init__(self, name: str, samples: list[float], size: float | None = None) -> None:
        self.name, self.samples, self.size = name, samples, size

    def line(self) -> str:
        size = f"{self.size / 1024:.0f}" if self.size is not None else ""
        return (f"| {self.name} | {statistics.median(self.samples):.2f} | "
                f"{p95(self.samples):.2f} | {size} | {len(self.samples)} |")


async def timed(name: str, n: int, call: Callable[[], Awaitable[object]],
                size: Callable[[object], int] | None = None) -> Row:
    for _ in range(min(10, n)):
        await call()
    samples, sizes = [], []
    for _ in range(n):
        started = time.perf_counter()
        result = await call()
        samples.append((time.perf_counter() - started) * 1000)
        if size is not None:
            sizes.append(size(result))
    return Row(name, samples, statistics.median(sizes) if sizes else None)


def show(cdp: CdpPage, html: str, workdir: Path, name: str) -> None:
    path = workdir / f"{name}.html"
    path.write_text(html)
    cdp.navigate(path.as_uri())
    deadline = time.monotonic() + 10
    while cdp.evaluate("document.readyState") != "complete":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not load")
        time.sleep(0.01)
    cdp.wait_painted()
    time.sleep(0.3)  # let the caret and late paints go quiet before timing screenshots


async def measure(sock: Path, cdp: CdpPage, workdir: Path, n: int, clicks: int,
                  ) -> tuple[list[Row], list[str]]:
    client = await AgentClient.connect_unix(str(sock))
    desk = AgentDesktop(client)
    rows: list[Row] = []
    notes: list[str] = []

    def nbytes(image: object) -> int:
        return len(image.data)  # type: ignore[attr-defined]

    try:
        await desk.ready(browser=True, timeout_s=10)
        # Each look captured and encoded, as bench/api.py's fresh_looks asks for them.
        qualities = itertools.cycle(FRESH_QUALITIES)
        for page_name, html in (("flat page", FLAT_PAGE), ("text page", text_page())):
            show(cdp, html, workdir, page_name.split()[0])
            for fmt in ("jpeg", "png"):
                rows.append(await timed(
                    f"screenshot {fmt.upper()} 1280x800, {page_name}", n,
                    lambda fmt=fmt: desk.capture(fmt, next(qualities)),  # type: ignore[misc]
                    nbytes))
        show(cdp, FLAT_PAGE, workdir, "flat")
        rows.append(await timed("click", n, lambda: desk.perform(a.Click(x=CLICK_X,
                                                                         y=CLICK_Y))))
        show(cdp, FLAT_PAGE, workdir, "flat")  # a fresh counter: earlier clicks may lag
        before = int(cdp.evaluate("bench.clicks"))
        for _ in range(clicks):
            await desk.perform(a.Click(x=CLICK_X, y=CLICK_Y))
        deadline = time.monotonic() + 10
        while (landed := int(cdp.evaluate("bench.clicks")) - before) < clicks:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        notes.append(f"{landed} of {clicks} back-to-back clicks landed in the page.")
        # The first typing follows the clicks above: it waits once for the last of them to
        # land (click_to_key_s of quiet), as keys right after a click do; the rest do not.
        call_ms, dom_ms, page_ms = await typing(desk, cdp, TYPED, max(3, n // 20))
        rows.append(Row("type 100 ASCII chars: the call", call_ms))
        rows.append(Row("type 100 ASCII chars: until exact in the DOM (+1 CDP poll)", dom_ms))
        rows.append(Row("type 100 ASCII chars: until exact in the DOM (the page's clock)",
                        page_ms))
        # Its characters off the layout are lent keycodes the first time (the browser
        # re-reads the layout), which they keep: the first typing apart from the rest.
        call_ms, dom_ms, _ = await typing(desk, cdp, TYPED_OFF_LAYOUT, 1 + max(3, n // 20))
        rows.append(Row(f"type {TYPED_OFF_LAYOUT!r}, the first time: the call", call_ms[:1]))
        rows.append(Row(f"type {TYPED_OFF_LAYOUT!r}, the first time: until exact in the DOM",
                        dom_ms[:1]))
        rows.append(Row(f"type {TYPED_OFF_LAYOUT!r} again: the call", call_ms[1:]))
        rows.append(Row(f"type {TYPED_OFF_LAYOUT!r} again: until exact in the DOM",
                        dom_ms[1:]))
        call_ms, dom_ms, _ = await typing(desk, cdp, TYPED_CJK, 1 + max(3, n // 20))
        rows.append(Row(f"type {TYPED_CJK!r} again: the call", call_ms[1:]))
        rows.append(Row(f"type {TYPED_CJK!r} again: until exact in the DOM", dom_ms[1:]))
        # The two sentences in turns, each after an agent's pause (its model's turn): the
        # keycodes of the one before are taken back (their keys long read) and lent anew.
        call_ms, dom_ms = [], []
        for turn in range(max(4, n // 20)):
            await asyncio.sleep(2.5)
            calls, doms, _ = await typing(desk, cdp, (TYPED_CJK, TYPED_CJK_OTHER)[turn % 2], 1)
            call_ms += calls
            dom_ms += doms
        rows.append(Row("type a new Chinese sentence after 2.5 s: the call", call_ms))
        rows.append(Row("type a new Chinese sentence after 2.5 s: until exact in the DOM",
                        dom_ms))
        show(cdp, text_page(), workdir, "text")  # the frame the encoders are timed on
    finally:
        await client.close()
    return rows, notes


ENCODERS = r"""
import io, json, statistics, sys, time, zlib
from deskbox_agent.desktop.capture import Capturer
from deskbox_agent.desktop.encode import encode
from deskbox_agent.desktop.strips import Strips
from Xlib.display import Display
display = Display(sys.argv[1])
cap = Capturer(sys.argv[1], display)
frame = cap.grab(0, 0, 1280, 800)
out = {}
def run(name, fn, n=int(sys.argv[2])):
    fn()
    samples, size = [], 0
    for _ in range(n):
        t = time.perf_counter(); data = fn(); samples.append((time.perf_counter() - t) * 1000)
        size = len(data)
    out[name] = [statistics.median(samples), sorted(samples)[int(0.95 * (n - 1))], size]
run("capture (XShmGetImage)", lambda: cap.grab(0, 0, 1280, 800).pixels.tobytes())
run("JPEG q75 (simplejpeg)", lambda: encode(frame, "jpeg", 75).data)
run("PNG (ISA-L level 1, unfiltered)", lambda: encode(frame, "png", 75).data)
strips = Strips()
run(f"JPEG q75 in strips ({strips.pieces} on {strips.count} threads, as a look is)",
    lambda: encode(frame, "jpeg", 75, strips).data)
run(f"PNG in strips ({strips.pieces} on {strips.count} threads, as a look is)",
    lambda: encode(frame, "png", 75, strips).data)
def pil_png():
    b = io.BytesIO(); frame.to_pil().save(b, format="PNG", compress_level=1); return b.getvalue()
run("PNG (Pillow, zlib level 1: the former host driver)", pil_png)
print(json.dumps(out))
"""


def encoders(site: Path, display: str, n: int) -> list[Row]:
    env = {**os.environ, "PYTHONPATH": f"{AGENT_DIR}{os.pathsep}{site}"}
    done = subprocess.run([sys.executable, "-c", ENCODERS, display, str(n)], env=env,
                          capture_output=True, text=True, check=True)
    return [Row(name, [p50, p95_], size)
            for name, (p50, p95_, size) in json.loads(done.stdout).items()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--clicks", type=int, default=1000)
    parser.add_argument("--python", default=sys.executable,
                        help="the agent's interpreter (/usr/bin/python3: the image's Debian "
                             "CPython 3.11, for memory figures like the image's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        site = workdir / "site"
        install_agent_wheels(site)
        plain = start_agent(workdir / "plain.sock", site, None, args.python)
        time.sleep(1.0)
        memory = {"idle, no display (the agent before this change)": pss_mib(plain.pid)}
        plain.terminate()
        plain.wait()
        with LocalSandbox() as local, CdpPage.first(local.devtools_url) as cdp:
            agent = start_agent(workdir / "agent.sock", site, local.display_name, args.python)
            try:
                time.sleep(1.0)
                memory["idle, with --display (no desktop call yet)"] = pss_mib(agent.pid)
                rows, notes = asyncio.run(measure(workdir / "agent.sock", cdp, workdir,
                                                  args.iterations, args.clicks))
                memory["right after screenshots, clicks and typing"] = pss_mib(agent.pid)
                time.sleep(3.0)  # the agent gives free memory back after 2 s idle
                memory["idle again, 3 s later"] = pss_mib(agent.pid)
            finally:
                agent.terminate()
                agent.wait()
            encode_rows = encoders(site, local.display_name, args.iterations)
    print(f"### The desktop through deskbox-agent ({args.iterations} sequential calls)\n")
    print("| host call | p50 ms | p95 ms | KiB | n |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(row.line())
    print()
    for note in notes:
        print(note)
    print("\n### Inside the agent, text page frame 1280x800\n")
    print("| step | p50 ms | p95 ms | KiB | n |")
    print("|---|---|---|---|---|")
    for row in encode_rows:
        print(f"| {row.name} | {row.samples[0]:.2f} | {row.samples[1]:.2f} | "
              f"{(row.size or 0) / 1024:.0f} | {args.iterations} |")
    print(f"\n### The agent's memory (PSS, agent under {args.python})\n")
    print("| state | PSS MiB |")
    print("|---|---|")
    for state, mib in memory.items():
        print(f"| {state} | {mib:.1f} |")
    print(f"\nLoad average while measuring: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs (wall times include waiting for a CPU).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
