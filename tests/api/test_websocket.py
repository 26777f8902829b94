"""``WS /actions/ws``: one action per message, replies in order, images as binary frames."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

from .conftest import KEY_A, EventPage, Server
from .helpers import decode

RED = (255, 0, 0)


@pytest.fixture
def ws(server: Server, session: dict[str, Any]) -> Iterator[ClientConnection]:
    with connect(
        session["urls"]["actions_ws"],
        additional_headers={"Authorization": f"Bearer {KEY_A}"},
        compression=None,
        open_timeout=10,
    ) as connection:
        yield connection


def reply(ws: ClientConnection) -> tuple[dict[str, Any], list[bytes]]:
    """One JSON reply and the binary frames it announces."""
    text = ws.recv(timeout=20)
    assert isinstance(text, str), "expected a JSON reply, got a binary frame"
    message: dict[str, Any] = json.loads(text)
    frames = []
    for _ in range(message.get("binary_frames", 0)):
        frame = ws.recv(timeout=20)
        assert isinstance(frame, bytes)
        frames.append(frame)
    return message, frames


def origin(ws: ClientConnection, page: EventPage) -> tuple[int, int]:
    page.clear()
    ws.send(json.dumps({"id": "o", "action": {"type": "click", "x": 640, "y": 700}}))
    assert reply(ws)[0] == {"id": "o", "ok": True, "result": {}}
    click = page.wait_for("click")[0]
    page.clear()
    return click["screenX"] - click["clientX"], click["screenY"] - click["clientY"]


def test_screenshot_comes_as_a_binary_frame(ws: ClientConnection, page: EventPage) -> None:
    ox, oy = origin(ws, page)
    ws.send(json.dumps({"id": 7, "action": {"type": "screenshot", "format": "png"}}))
    message, frames = reply(ws)
    assert message["id"] == 7 and message["ok"] is True
    assert message["result"] == {"media_type": "image/png", "width": 1280, "height": 800,
                                 "size": len(frames[0])}
    image = decode(frames[0])
    assert image.getpixel((ox + 200, oy + 150)) == RED


def test_click_and_settled_screenshot(ws: ClientConnection, page: EventPage) -> None:
    ox, oy = origin(ws, page)
    ws.send(json.dumps({
        "id": 8,
        "action": {"type": "click", "x": ox + 150, "y": oy + 150},
        "screenshot": {"format": "jpeg"},
    }))
    message, frames = reply(ws)
    assert message["ok"] is True and message["result"] == {}
    assert message["screenshot"]["media_type"] == "image/jpeg"
    assert decode(frames[0]).size == (1280, 800)
    click = page.wait_for("click")[0]
    assert (click["clientX"], click["clientY"]) == (150, 150)


def test_many_in_flight_keep_their_order(ws: ClientConnection) -> None:
    sent = []
    for n in range(30):
        match n % 5:
            case 0:
                action: Any = {"type": "screenshot", "format": "jpeg", "quality": 30}
            case 1:
                action = {"type": "move", "x": 10 + n, "y": 20 + n}
            case 2:
                action = {"type": "cursor_position"}
            case 3:
                action = {"type": "click", "x": 99999, "y": 0}  # refused by the schema
            case _:
                action = {"type": "move", "x": 1279, "y": 800}  # off-screen: refused by driver
        sent.append(n)
        ws.send(json.dumps({"id": n, "action": action}))
    ws.send("not json")
    ws.send(b"\x00binary")
    replies = [reply(ws) for _ in range(32)]
    assert [m["id"] for m, _ in replies] == [*sent, None, None]
    for n, (message, frames) in enumerate(replies[:30]):
        if n % 5 == 0:
            assert message["ok"] and len(frames) == 1 and frames[0][:2] == b"\xff\xd8"
        elif n % 5 == 2:
            # The move just before it has already happened: order is kept on the desktop.
            assert message["result"] == {"x": 10 + n - 1, "y": 20 + n - 1}
        elif n % 5 in (3, 4):
            assert message["ok"] is False
            assert message["error"]["type"] == "invalid_request"
            assert message["error"]["request_id"].startswith("req_")
        else:
            assert message == {"id": n, "ok": True, "result": {}}
    assert all(m["ok"] is False for m, _ in replies[30:])
    # Still serving after all that.
    ws.send(json.dumps({"id": "last", "action": {"type": "screen_size"}}))
    assert reply(ws)[0] == {"id": "last", "ok": True,
                            "result": {"width": 1280, "height": 800}}


def test_a_message_over_the_request_limit_is_refused_and_the_socket_goes_on(
    ws: ClientConnection, server: Server,
) -> None:
    too_big = json.dumps({"id": 1, "action": {"type": "type",
                                              "text": "x" * server.settings.max_request_bytes}})
    ws.send(too_big)
    refused, _ = reply(ws)
    assert refused["ok"] is False and refused["error"]["type"] == "invalid_request"
    assert "DESKBOX_MAX_REQUEST_BYTES" in refused["error"]["message"]
    ws.send(json.dumps({"id": 2, "action": {"type": "cursor_position"}}))
    assert reply(ws)[0]["ok"] is True


def test_json_nested_too_deep_is_refused_and_the_socket_goes_on(ws: ClientConnection) -> None:
    """Deeper than the parser recurses: refused like any bad message; the socket goes on."""
    ws.send("[" * 5000)
    refused, _ = reply(ws)
    assert refused["ok"] is False and refused["error"]["type"] == "invalid_request", refused
    ws.send(json.dumps({"id": 2, "action": {"type": "cursor_position"}}))
    assert reply(ws)[0]["ok"] is True
