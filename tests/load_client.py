"""Many agents at once: mixed actions over the actions websocket, every reply checked.

Used by ``bench/load.py`` (20 clients x 1,000 actions over 10 sessions) and by
``tests/api/test_load.py`` (a short run). Each client holds one websocket to its session
(client i drives session i mod N) and runs its actions one at a time, as an agent does:
screenshots (JPEG q75), clicks and short typing into a page that is one big text area.
A reply counts as an error unless it is exactly what the protocol promises: the same id,
``ok``, the result's shape for its action and, for a screenshot, one binary JPEG frame of
the announced size and the screen's dimensions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

__all__ = ["FLAT_TEXT_PAGE", "KINDS", "TEXT_PAGE", "LoadResult", "percentile", "plan", "run_load"]

KINDS = ("screenshot", "click", "type")
_WEIGHTS = (4, 4, 2)


def _text_page(extra_style: str = "") -> str:
    html = (
        "<!doctype html><title>load</title><body style='margin:0'><textarea style='"
        f"{extra_style}box-sizing:border-box;width:100vw;height:100vh;font-size:14px'>"
        "</textarea></body>"
    )
    return "data:text/html;base64," + base64.b64encode(html.encode()).decode()


TEXT_PAGE = _text_page()
# The same text area drawn by the page instead of Chromium's native theme. A native one is
# repainted whole, every tile of it, when a click presses and releases it (Chromium's
# paint-invalidation trace: the textarea's subtree): in a 1280x800 text area that is ~13 ms
# of Chromium's CPU per click against ~6 ms (bench/README.md, "Load").
FLAT_TEXT_PAGE = _text_page("appearance:none;border:1px solid #767676;")


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1) of a non-empty sample."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def plan(rng: random.Random, count: int, width: int, height: int) -> list[dict[str, Any]]:
    """``count`` actions: 40 % screenshots, 40 % clicks in the page, 20 % typing."""
    actions: list[dict[str, Any]] = []
    for kind in rng.choices(KINDS, weights=_WEIGHTS, k=count):
        if kind == "screenshot":
            actions.append({"type": "screenshot", "format": "jpeg", "quality": 75})
        elif kind == "click":
            # Below the browser's toolbar: clicks land in the text area.
            actions.append({"type": "click", "x": rng.randrange(40, width - 40),
                            "y": rng.randrange(160, height - 40)})
        else:
            text = "".join(rng.choices(string.ascii_lowercase + " ", k=rng.randrange(4, 13)))
            actions.append({"type": "type", "text": text})
    return actions


@dataclass
class LoadResult:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def actions(self) -> int:
        return sum(len(samples) for samples in self.latencies.values())


def _problem(
    reply: object, message_id: int, action: Mapping[str, Any], size: tuple[int, int]
) -> str | None:
    """What is wrong with a reply (None: it is what the protocol promises)."""
    if not isinstance(reply, dict):
        return f"not a JSON object: {reply!r:.200}"
    if reply.get("id") != message_id or reply.get("ok") is not True:
        return f"wrong id or not ok: {reply!r:.300}"
    result = reply.get("result")
    if action["type"] == "screenshot":
        if not isinstance(result, dict) or set(result) != {"media_type", "width", "height",
                                                           "size"}:
            return f"a screenshot answered {result!r:.200}"
        if result["media_type"] != "image/jpeg" or (result["width"], result["height"]) != size:
            return f"unexpected image {result!r}"
        if reply.get("binary_frames") != 1:
            return f"a screenshot announced {reply.get('binary_frames')} frames"
    elif result != {} or "binary_frames" in reply:
        return f"a {action['type']} answered {reply!r:.200}"
    return None


async def _client(
    ws: ClientConnection, actions: Sequence[Mapping[str, Any]], size: tuple[int, int],
    result: LoadResult, timeout_s: float,
) -> None:
    for message_id, action in enumerate(actions):
        started = time.perf_counter()
        await ws.send(json.dumps({"id": message_id, "action": action}))
        text = await asyncio.wait_for(ws.recv(), timeout_s)
        reply = json.loads(text) if isinstance(text, str) else text
        problem = _problem(reply, message_id, action, size)
        if problem is None and action["type"] == "screenshot":
            frame = await asyncio.wait_for(ws.recv(), timeout_s)
            if not isinstance(frame, bytes) or len(frame) != reply["result"]["size"] \
                    or not frame.startswith(b"\xff\xd8"):
                problem = "the screenshot's frame is not the JPEG announced"
        if problem is not None:
            result.errors.append(f"{action['type']} #{message_id}: {problem}")
            return  # the stream may be out of step now: this client stops
        result.latencies[str(action["type"])].append(time.perf_counter() - started)


async def _run_one(
    url: str, headers: Mapping[str, str], actions: Sequence[Mapping[str, Any]],
    size: tuple[int, int], result: LoadResult, timeout_s: float,
) -> None:
    try:
        async with connect(url, additional_headers=dict(headers), compression=None,
                           max_size=None, open_timeout=timeout_s) as ws:
            await _client(ws, actions, size, result, timeout_s)
    except Exception as error:  # a failed client is an error of the run, not a crash
        result.errors.append(f"client on {url}: {type(error).__name__}: {error}")


async def run_load(
    urls: Sequence[str],
    headers: Mapping[str, str],
    clients: int,
    actions_per_client: int,
    size: tuple[int, int],
    seed: int = 1,
    timeout_s: float = 60.0,
) -> LoadResult:
    """``clients`` clients on the ``urls`` (actions websockets), all at once."""
    rng = random.Random(seed)
    plans = [plan(rng, actions_per_client, *size) for _ in range(clients)]
    result = LoadResult()
    started = time.perf_counter()
    await asyncio.gather(*(
        _run_one(urls[n % len(urls)], headers, plans[n], size, result, timeout_s)
        for n in range(clients)
    ))
    result.seconds = time.perf_counter() - started
    return result
