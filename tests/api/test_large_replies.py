"""REST replies whose screenshots are large (base64 and JSON ~5 ms per MB) are made on a
worker thread, not on the event loop every session shares, and are the same JSON and
headers as the small ones made on the loop. The size line is lowered to 0 here, so that the
session's 1280×800 page takes the large replies' path."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pydantic_core
import pytest

from deskbox_server.api import replies

from .helpers import decode

CASES = [
    ("actions", {"actions": [{"type": "screen_size"}, {"type": "screenshot", "format": "png"}],
                 "screenshot": {"format": "png"}}),
    ("actions/anthropic", {"action": "screenshot"}),
    ("actions/openai", {"call_id": "call_1", "action": {"type": "screenshot"}}),
    ("actions/anthropic", {"action": "left_click", "coordinate": [5, 5]}),
]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_a_large_reply_is_made_off_the_loop_and_reads_the_same(
    client: httpx.Client, session: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    path: str, body: dict[str, Any],
) -> None:
    url = f"/v1/sessions/{session['id']}/{path}"
    on_loop = client.post(url, json=body)
    assert on_loop.status_code == 200, on_loop.text

    made_on_loop: list[bool] = []
    to_json = pydantic_core.to_json

    def watched(value: Any, **options: Any) -> bytes:
        try:
            asyncio.get_running_loop()
            made_on_loop.append(True)
        except RuntimeError:
            made_on_loop.append(False)
        return to_json(value, **options)

    monkeypatch.setattr(replies, "ENCODE_ON_LOOP_BYTES", 0)
    monkeypatch.setattr(replies.pydantic_core, "to_json", watched)
    on_thread = client.post(url, json=body)
    assert on_thread.status_code == 200, on_thread.text

    assert made_on_loop == [False]
    assert on_thread.headers["content-type"] == on_loop.headers["content-type"]
    assert on_thread.headers.get("x-deskbox-settled") == on_loop.headers.get("x-deskbox-settled")
    assert without_images(on_thread.json()) == without_images(on_loop.json())


def without_images(value: Any) -> Any:
    """The reply with each image replaced by its decoded size (the page's caret blinks: the
    pictures of two replies may differ)."""
    if isinstance(value, list):
        return [without_images(item) for item in value]
    if not isinstance(value, dict):
        return value
    found = {key: without_images(item) for key, item in value.items()}
    for key in ("data_b64", "data"):
        if isinstance(value.get(key), str):
            found[key] = decode(base64.b64decode(value[key])).size
    if isinstance(value.get("image_url"), str):
        data = value["image_url"].partition(";base64,")[2]
        found["image_url"] = decode(base64.b64decode(data)).size
    return found
