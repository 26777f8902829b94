"""Recordings and trajectories (API.md "Recordings and trajectories") on the local backend:
real HTTP, a real desktop and agent, a real RFB viewer for the human's input, the video
decoded with PyAV. The console's replay page is tested in a browser (test_console.py)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import struct
import threading
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import av
import httpx
import pytest
from PIL import Image
from websockets.sync.client import connect

from deskbox_server.errors import QuotaExceeded
from deskbox_server.sessions.human_input import HumanAction, HumanInput
from deskbox_server.sessions.keysym_chars import legacy_keysym_char
from deskbox_server.sessions.recorder import Recorder
from deskbox_server.sessions.recording_store import RecordingMeta, RecordingStore
from deskbox_server.sessions.recordings import Recordings
from deskbox_server.settings import Settings

from ..rfb_client import RfbViewer
from .conftest import DISPLAY, KEY_A, KEY_B, Server, running_server
from .helpers import assert_error

PAGE = ("data:text/html,<body style='margin:0;background:%23fff'>"
        "<input id=q style='font-size:40px;width:900px' autofocus></body>")


def trajectory(client: httpx.Client, sid: str) -> list[dict[str, Any]]:
    response = client.get(f"/v1/sessions/{sid}/trajectory")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def wait_for(check: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.fixture(scope="module")
def recorded(client: httpx.Client) -> Iterator[dict[str, Any]]:
    response = client.post("/v1/sessions", json={
        "display": DISPLAY, "record": True, "browser": {"start_url": PAGE}})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    yield session
    client.delete(f"/v1/sessions/{session['id']}")
    client.delete(f"/v1/sessions/{session['id']}/recording")


def test_a_recording_keeps_actions_frames_screenshots_and_events(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    sid = recorded["id"]
    # A scaled coordinate space: the replay's marker is still in screen pixels.
    click = client.post(f"/v1/sessions/{sid}/actions", json={
        "actions": [{"type": "click", "x": 320, "y": 20}],
        "coordinate_space": {"width": 640, "height": 400}})
    assert click.status_code == 200, click.text
    typed = client.post(f"/v1/sessions/{sid}/actions", json={
        "actions": [{"type": "type", "text": "hello recording"}, {"type": "key", "keys": "Return"}],
        "screenshot": {"format": "png"}})
    assert typed.status_code == 200, typed.text

    def after_the_typing() -> list[dict[str, Any]] | None:
        # The typing's frame comes after it (at most 4 a second), as an agent that looks
        # before it acts again would see it; frame_after is the first frame taken before
        # the next action.
        entries = trajectory(client, sid)
        keys = [e for e in entries if e["kind"] == "action" and e["action"]["type"] == "key"]
        done = keys and any(e["kind"] == "frame" and e["t"] >= keys[0]["end_t"]
                            for e in entries)
        return entries if done else None

    assert wait_for(after_the_typing)
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
        "actions": [{"type": "click", "x": 5000, "y": 5}]}), 422, "invalid_request")
    assert client.post(f"/v1/sessions/{sid}/handoff", json={"reason": "a captcha"}).status_code \
        == 200
    entries = trajectory(client, sid)

    actions = [e for e in entries if e["kind"] == "action"]
    assert [a["action"]["type"] for a in actions] == ["click", "type", "key", "click"]
    first, text, key, refused = actions
    assert first["source"] == {"type": "api_key", "id": first["source"]["id"]}
    assert first["screen_point"] == {"x": 640, "y": 40}
    assert text["action"]["text"] == "hello recording" and key["action"]["keys"] == "Return"
    assert key["screenshot"] and "screenshot" not in text
    assert refused["error"]["type"] == "invalid_request" and "5000" in refused["error"]["message"]
    assert all(e["t"] <= e["end_t"] for e in actions)
    assert [e["t"] for e in entries] == sorted(e["t"] for e in entries)
    events = [e["event"]["type"] for e in entries if e["kind"] == "event"]
    assert events[0] == "recording_started" and "help_requested" in events
    # The typing changed the screen: the frame after it is not the frame before it.
    assert text["frame_before"] is not None and key["frame_after"] is not None
    assert key["frame_after"] > text["frame_before"]

    before = client.get(f"/v1/sessions/{sid}/recording/frames/{text['frame_before']}")
    after = client.get(f"/v1/sessions/{sid}/recording/frames/{key['frame_after']}")
    assert before.headers["content-type"] == "image/jpeg"
    images = [Image.open(io.BytesIO(r.content)) for r in (before, after)]
    assert all(i.size == (1280, 800) for i in images)
    assert images[0].tobytes() != images[1].tobytes()

    recording = client.get(f"/v1/sessions/{sid}/recording").json()
    assert recording["state"] == "recording" and recording["actions"] == 4
    assert recording["frames"] >= 2 and recording["bytes"] > 0
    assert (recording["width"], recording["height"]) == (1280, 800)


def test_the_video_and_the_export(
    client: httpx.Client, server: Server, recorded: dict[str, Any]
) -> None:
    sid = recorded["id"]
    assert client.post(f"/v1/sessions/{sid}/actions", json={
        "actions": [{"type": "type", "text": "more"}], "screenshot": {"format": "jpeg"}}
    ).status_code == 200
    video = client.get(f"/v1/sessions/{sid}/recording.mp4", timeout=60)
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    meta = server.services.manager.recordings.store.meta(sid)
    assert meta is not None and meta.video_bytes == len(video.content)  # kept, and counted
    with av.open(io.BytesIO(video.content)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        decoded = list(container.decode(stream))
    assert (decoded[0].width, decoded[0].height) == (1280, 800) and len(decoded) >= 2

    export = client.get(f"/v1/sessions/{sid}/trajectory.zip", timeout=60)
    assert export.status_code == 200 and export.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(export.content)) as archive:
        names = archive.namelist()
        lines = archive.read("trajectory.jsonl").decode().splitlines()
        meta = json.loads(archive.read("recording.json"))
    assert "frames/000000.jpg" in names and any(n.startswith("shots/") for n in names)
    assert meta["session_id"] == sid and "owner" not in meta
    assert any(json.loads(line).get("action", {}).get("text") == "more" for line in lines)


def test_a_humans_input_through_the_live_view_is_recorded(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    sid = recorded["id"]
    token = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "control"}).json()
    with RfbViewer(f"{recorded['urls']['vnc_ws']}?token={token['token']}") as viewer:
        viewer.click(200, 30)
        for char in "hi":
            viewer.key(ord(char), True)
            viewer.key(ord(char), False)
        viewer.key(0xFF0D, True)  # Return
        viewer.key(0xFF0D, False)

    def human() -> list[dict[str, Any]]:
        return [e for e in trajectory(client, sid)
                if e["kind"] == "action" and e["source"]["type"] == "token"]

    actions = wait_for(lambda: len(human()) >= 3 and human())
    # Its defaults left out, as the agent's actions are: a left click has no button.
    assert [a["action"] for a in actions] == [
        {"type": "click", "x": 200, "y": 30},
        {"type": "type", "text": "hi"}, {"type": "key", "keys": "Return"}]
    assert {a["source"]["id"] for a in actions} == {token["id"]}
    assert actions[0]["screen_point"] == {"x": 200, "y": 30}


def test_a_humans_input_is_recorded_in_the_sessions_coordinate_space(
    client: httpx.Client,
) -> None:
    """A session whose agent works in a 640x400 space on a 1280x800 screen: the API's
    actions are recorded in that space, the human's were in screen pixels, so a replay or
    a training set read a human's click at (200, 30) as the agent's at (200, 30), twice
    as far, and a click near the screen's far corner was one the API refuses (off the
    space). Both are in the space now; ``screen_point`` stays in screen pixels."""
    created = client.post("/v1/sessions", json={
        "display": DISPLAY, "record": True, "browser": {"start_url": PAGE},
        "coordinate_space": {"width": 640, "height": 400}})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    try:
        token = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "control"}).json()
        with RfbViewer(f"{created.json()['urls']['vnc_ws']}?token={token['token']}") \
                as viewer:
            viewer.click(200, 30)
            viewer.pointer(400, 400, 1)  # a drag
            viewer.pointer(600, 500, 1)
            viewer.pointer(600, 500, 0)
            viewer.pointer(300, 300, 1 << 4)  # a notch down
            viewer.pointer(300, 300, 0)
            viewer.click(1278, 798)
            viewer.pointer(600, 300, 0)  # a right click
            viewer.pointer(600, 300, 1 << 2)
            viewer.pointer(600, 300, 0)
            viewer.full_frame()  # all of it reached the server

        def human() -> list[dict[str, Any]]:
            return [e for e in trajectory(client, sid)
                    if e["kind"] == "action" and e["source"]["type"] == "token"]

        actions = wait_for(lambda: len(human()) >= 5 and human())
        # Defaults left out, as the agent's actions are kept: a left button is no button.
        assert [a["action"] for a in actions] == [
            {"type": "click", "x": 100, "y": 15},
            {"type": "drag", "path": [[200, 200], [300, 250]]},
            {"type": "scroll", "x": 150, "y": 150, "dy": 1},
            {"type": "click", "x": 639, "y": 399},
            {"type": "click", "x": 300, "y": 150, "button": "right"}]
        assert [a["screen_point"] for a in actions] == [
            {"x": 200, "y": 30}, {"x": 400, "y": 400}, {"x": 300, "y": 300},
            {"x": 1278, "y": 798}, {"x": 600, "y": 300}]
        for entry in actions:  # each is one the API takes as it is, in the session's space
            replayed = client.post(f"/v1/sessions/{sid}/actions", json=entry["action"])
            assert replayed.status_code == 200, replayed.text
        agent = [e for e in trajectory(client, sid)
                 if e["kind"] == "action" and e["source"]["type"] == "api_key"]
        def where(action: dict[str, Any]) -> Any:
            return action.get("path") or (action["x"], action["y"])

        assert [where(e["action"]) for e in agent] == [where(e["action"]) for e in actions]
        assert [e["screen_point"] for e in agent] == [e["screen_point"] for e in actions]
    finally:
        client.delete(f"/v1/sessions/{sid}")
        client.delete(f"/v1/sessions/{sid}/recording")


def test_a_non_us_keyboard_and_the_wheel_are_recorded_as_actions_the_api_takes(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    """What noVNC sends for a German or Russian keyboard: AltGr (ISO_Level3_Shift) with
    "@", the legacy keysyms of "п", "р" and "€", the keypad's Home; and the horizontal and
    shifted wheel. AltGr was a key "0xfe03" of its own, each Cyrillic letter and "€" a key
    "0x6d0" (no key the API takes), the keypad's Home "0xff95", and the horizontal wheel
    and the wheel's modifiers were left out."""
    sid = recorded["id"]
    token = client.post(f"/v1/sessions/{sid}/tokens", json={"scope": "control"}).json()

    def tap(keysym: int) -> None:
        viewer.key(keysym, True)
        viewer.key(keysym, False)

    with RfbViewer(f"{recorded['urls']['vnc_ws']}?token={token['token']}") as viewer:
        viewer.key(0xFE03, True)
        tap(ord("@"))
        viewer.key(0xFE03, False)
        for keysym in (0x6D0, 0x6D2, 0x20AC, 0xFF95):  # п, р, €, KP_Home
            tap(keysym)
        for _ in range(2):  # two notches left
            viewer.pointer(300, 300, 1 << 5)
            viewer.pointer(300, 300, 0)
        viewer.key(0xFFE1, True)  # Shift_L
        viewer.pointer(300, 300, 1 << 4)  # a notch down
        viewer.pointer(300, 300, 0)
        viewer.key(0xFFE1, False)
        viewer.full_frame()  # all of it reached the server

    def human() -> list[dict[str, Any]]:
        return [e["action"] for e in trajectory(client, sid) if e["kind"] == "action"
                and e["source"] == {"type": "token", "id": token["id"]}]

    actions = wait_for(lambda: len(human()) >= 4 and human())
    assert actions == [
        {"type": "type", "text": "@пр€"}, {"type": "key", "keys": "KP_Home"},
        {"type": "scroll", "x": 300, "y": 300, "dx": -2},
        {"type": "scroll", "x": 300, "y": 300, "dy": 1, "modifiers": ["shift"]},
    ]
    for action in actions:  # each is one the API takes as it is
        assert client.post(f"/v1/sessions/{sid}/actions", json=action).status_code == 200


def test_the_characters_of_legacy_keysyms_are_novncs_table_turned_around() -> None:
    """keysym_chars.py is noVNC's character → keysym table reversed: the keysyms a viewer
    sends for characters read back as those characters."""
    table = (Path(__file__).parents[2] / "vnc/novnc/core/input/keysymdef.js").read_text()
    pairs = re.findall(r"0x([0-9a-f]+): 0x([0-9a-f]+),", table)
    legacy = {int(keysym, 16): chr(int(code, 16)) for code, keysym in pairs
              if int(keysym, 16) < 0x1000000}
    assert len(legacy) > 600
    assert {keysym: legacy_keysym_char(keysym) for keysym in legacy} == legacy
    assert legacy_keysym_char(0xFF0D) is None and legacy_keysym_char(0x41) is None


def test_a_secrets_name_is_kept_never_its_value(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    sid = recorded["id"]
    value = "hunter2-recorded-never"
    assert client.post("/v1/secrets", json={
        "name": "REC_PW", "value": value,
        "allowed_origins": ["https://example.org"]}).status_code == 201
    try:
        # Not typed here (the focused page is not of its origin), and kept as refused.
        assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
            "type": "type", "secret": "REC_PW"}), 403, "secret_origin_mismatch")
        raw = client.get(f"/v1/sessions/{sid}/trajectory").text
        assert value not in raw
        refused = [json.loads(line) for line in raw.splitlines() if "REC_PW" in line]
        assert refused[-1]["action"] == {"type": "type", "secret": "REC_PW"}
        assert refused[-1]["error"]["type"] == "secret_origin_mismatch"
    finally:
        client.delete("/v1/secrets/REC_PW")


def test_a_vendor_call_refused_whole_is_recorded(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    """A dialect's call with a point off the screen is refused before any of it runs, as
    a batch of ours is by the desktop; the trajectory left it out, so a model's refused
    tool calls were missing from the episodes of the vendor endpoints."""
    sid = recorded["id"]
    assert_error(client.post(f"/v1/sessions/{sid}/actions/anthropic", json={
        "action": "left_click", "coordinate": [5000, 3]}), 422, "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/actions/openai", json={
        "call_id": "c1", "actions": [{"type": "move", "x": 7, "y": 8},
                                     {"type": "click", "button": "left", "x": 9000, "y": 3}]}),
        422, "invalid_request")
    actions = [e for e in trajectory(client, sid) if e["kind"] == "action"][-3:]
    assert [(a["action"]["type"], a["action"].get("x")) for a in actions] == [
        ("click", 5000), ("move", 7), ("click", 9000)]
    assert "5000" in actions[0]["error"]["message"]
    assert "9000" in actions[2]["error"]["message"]
    assert all(a["source"]["type"] == "api_key" for a in actions)


def test_calls_refused_for_their_input_are_recorded_as_sent(
    client: httpx.Client, server: Server, recorded: dict[str, Any]
) -> None:
    """A point off the screen was kept with its error, but an action the schema refuses
    (a negative point, a fourth click, a scroll past 1,000 notches) was missing, and so
    was a vendor call with an unknown key or input the vendor's tool does not take: a
    model's refused calls were gaps in its episode. Each is kept as sent, with its error;
    a vendor call refused before it became actions of the API names its dialect."""
    sid = recorded["id"]
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json={"actions": [
        {"type": "move", "x": 3, "y": 3}, {"type": "click", "x": -1, "y": 5}]}),
        422, "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json={
        "type": "click", "x": 5, "y": 5, "count": 4}), 422, "invalid_request")
    with connect(server.ws_url(sid), additional_headers={"Authorization": f"Bearer {KEY_A}"},
                 open_timeout=10) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "scroll", "dy": 5000}}))
        assert json.loads(ws.recv(timeout=10))["ok"] is False
    assert_error(client.post(f"/v1/sessions/{sid}/actions/anthropic", json={
        "action": "key", "text": "ctrl+nosuchkey"}), 422, "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/actions/openai", json={
        "call_id": "c2", "actions": [{"type": "type", "text": "hi"},
                                     {"type": "keypress", "keys": ["CTRL", "NOPE"]}]}),
        422, "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/actions/anthropic", json={
        "action": "teleport", "coordinate": [1, 2]}), 422, "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/actions/openai",
                             params={"coordinate_space": "wide"},
                             json={"type": "click", "button": "left", "x": 1, "y": 2}),
                 422, "invalid_request")

    def refused() -> list[dict[str, Any]]:
        entries = [e for e in trajectory(client, sid) if e["kind"] in ("action", "refused")]
        return entries[-9:] if len(entries) >= 9 else []

    entries = wait_for(refused)
    assert [e.get("action", e.get("sent")) for e in entries] == [
        {"type": "move", "x": 3, "y": 3}, {"type": "click", "x": -1, "y": 5},
        {"type": "click", "x": 5, "y": 5, "count": 4}, {"type": "scroll", "dy": 5000},
        {"type": "key", "keys": "ctrl+nosuchkey"},
        {"type": "type", "text": "hi"}, {"type": "key", "keys": "CTRL+NOPE"},
        {"action": "teleport", "coordinate": [1, 2]},
        {"type": "click", "button": "left", "x": 1, "y": 2}]
    # The calls that never became actions are kept whole, named by their dialect: a
    # trajectory's actions stay actions of the API.
    assert [(e["kind"], e.get("dialect")) for e in entries[-2:]] == [
        ("refused", "anthropic"), ("refused", "openai")]
    assert {e["kind"] for e in entries[:-2]} == {"action"}
    with_error = [i for i, e in enumerate(entries) if "error" in e]
    assert with_error == [1, 2, 3, 4, 6, 7, 8]  # the last of each call, as the desktop's
    assert all(entries[i]["error"]["type"] == "invalid_request" for i in with_error)
    assert "nosuchkey" in entries[4]["error"]["message"]
    assert "NOPE" in entries[6]["error"]["message"]
    assert "wide" in entries[8]["error"]["message"]
    assert all(e["source"]["type"] == "api_key" for e in entries)
    # Input the schema refused was not read: no point the desktop would have acted at.
    assert [e["screen_point"] for e in entries[:4]] == [None] * 4


def test_a_screenshot_refused_for_its_query_is_recorded_as_sent(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    """``GET /screenshot`` with a query it refuses (a format it does not make, a quality
    past 1-100, a scale that is no size or too large) answered its 422 and left no trace
    in the recording, where every other refused call of the agent's is kept. Each is now
    a ``screenshot`` action of the query's own parameters as sent, with its error; a
    screenshot taken is recorded as before."""
    sid = recorded["id"]
    taken = client.get(f"/v1/sessions/{sid}/screenshot", params={"format": "png"})
    assert taken.status_code == 200 and taken.headers["content-type"] == "image/png"
    for params, named in (({"format": "gif"}, "format"),
                          ({"quality": "0", "format": "webp"}, "quality"),
                          ({"scale": "wide"}, "wide"),
                          ({"scale": "99999x10", "other": "left out"}, "16384")):
        error = assert_error(client.get(f"/v1/sessions/{sid}/screenshot", params=params),
                             422, "invalid_request")
        assert named in error["message"], error

    def shots() -> list[dict[str, Any]]:
        entries = [e for e in trajectory(client, sid)
                   if e["kind"] == "action" and e["action"]["type"] == "screenshot"]
        return entries[-5:] if len(entries) >= 5 else []

    entries = wait_for(shots)
    assert [e["action"] for e in entries] == [
        {"type": "screenshot", "format": "png"},
        {"type": "screenshot", "format": "gif"},
        {"type": "screenshot", "format": "webp", "quality": "0"},
        {"type": "screenshot", "scale": "wide"},
        {"type": "screenshot", "scale": "99999x10"}]
    assert "error" not in entries[0]
    assert [e["error"]["type"] for e in entries[1:]] == ["invalid_request"] * 4
    assert "format" in entries[1]["error"]["message"]
    assert "quality" in entries[2]["error"]["message"]
    assert "wide" in entries[3]["error"]["message"]
    assert "16384" in entries[4]["error"]["message"]
    assert all(e["source"]["type"] == "api_key" and e["screen_point"] is None
               for e in entries)


def test_the_screen_point_is_where_the_desktop_acted(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    """A point of a coordinate space is mapped to the screen as the desktop maps it
    (rounded to the nearest pixel): the trajectory's was rounded down, a pixel off."""
    sid = recorded["id"]
    space = {"width": 1024, "height": 640}  # 1.25 screen pixels each
    points = []
    for x, y in ((3, 3), (1023, 639)):
        assert client.post(f"/v1/sessions/{sid}/actions", json={
            "actions": [{"type": "move", "x": x, "y": y}], "coordinate_space": space,
        }).status_code == 200
        where = client.post(f"/v1/sessions/{sid}/actions", json={"type": "cursor_position"})
        points.append(where.json()["results"][0])
    assert points == [{"x": 4, "y": 4}, {"x": 1279, "y": 799}]
    moves = [e for e in trajectory(client, sid)
             if e["kind"] == "action" and e["action"]["type"] == "move"][-2:]
    assert [m["screen_point"] for m in moves] == points


def test_a_recording_outlives_its_session(client: httpx.Client, server: Server) -> None:
    created = client.post("/v1/sessions", json={"display": DISPLAY})
    sid = created.json()["id"]
    assert_error(client.get(f"/v1/sessions/{sid}/recording"), 404, "not_found")
    started = client.post(f"/v1/sessions/{sid}/recording/start")
    assert started.status_code == 200 and started.json()["state"] == "recording"
    assert client.post(f"/v1/sessions/{sid}/recording/start").json()["started_at"] == \
        started.json()["started_at"]  # starting again: it goes on
    client.post(f"/v1/sessions/{sid}/actions", json={"type": "move", "x": 3, "y": 4})
    stopped = client.post(f"/v1/sessions/{sid}/recording/stop").json()
    assert stopped["state"] == "stopped" and stopped["stop_reason"] is None
    assert stopped["expires_at"] > stopped["stopped_at"]
    client.post(f"/v1/sessions/{sid}/actions", json={"type": "move", "x": 9, "y": 9})
    assert client.post(f"/v1/sessions/{sid}/recording/start").json()["state"] == "recording"
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204

    recording = client.get(f"/v1/sessions/{sid}/recording").json()
    assert recording["state"] == "stopped" and recording["stop_reason"] == "the session ended"
    assert recording["actions"] == 1  # the move between the two parts was not recorded
    listed = client.get("/v1/recordings").json()["recordings"]
    assert sid in [r["session_id"] for r in listed]
    events = [e["event"] for e in trajectory(client, sid) if e["kind"] == "event"]
    assert [e["type"] for e in events].count("recording_started") == 2
    assert events[-1] == {"type": "recording_stopped", "at": events[-1]["at"],
                          "reason": "the session ended"}

    with server.client(KEY_B) as other:  # another key sees none of it
        assert_error(other.get(f"/v1/sessions/{sid}/trajectory"), 404, "not_found")
        assert sid not in [r["session_id"] for r in other.get("/v1/recordings").json()[
            "recordings"]]
    assert client.delete(f"/v1/sessions/{sid}/recording").status_code == 204
    assert_error(client.get(f"/v1/sessions/{sid}/recording.mp4"), 404, "not_found")
    assert_error(client.post(f"/v1/sessions/{sid}/recording/start"), 404, "not_found")


def test_a_long_trajectory_is_sent_without_being_held_whole(
    client: httpx.Client, server: Server
) -> None:
    """A trajectory of 20 MB (a thousand typings of 20,000 characters, the most one may
    carry): read whole and parsed, it took about eight times its size in the server's
    memory, for each request at once. Now it is read a line at a time as it is sent, in
    time order and with each action's frames as before."""
    created = client.post("/v1/sessions", json={"display": DISPLAY, "record": True})
    sid = created.json()["id"]
    for text in ("first", "second"):
        assert client.post(f"/v1/sessions/{sid}/actions", json={
            "type": "type", "text": text}).status_code == 200
    assert client.delete(f"/v1/sessions/{sid}").status_code == 204
    path = server.settings.state_dir / "recordings" / sid / "trajectory.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    typing = next(e for e in lines if e["kind"] == "action")
    latest, seq = max(e.get("end_t", e["t"]) for e in lines), max(e["seq"] for e in lines)
    with path.open("a") as file:  # the recorder's own lines, as a long session leaves them
        for n in range(1, 1001):
            t = latest + n * 0.01
            file.write(json.dumps({**typing, "t": t, "end_t": t + 0.005, "seq": seq + n,
                                   "action": {"type": "type", "text": "x" * 20_000}}) + "\n")
    size = path.stat().st_size
    assert size > 20_000_000
    tracemalloc.start()
    try:
        with client.stream("GET", f"/v1/sessions/{sid}/trajectory") as response:
            assert response.status_code == 200
            received, kinds, times = 0, [], []
            for line in response.iter_lines():
                entry = json.loads(line)
                received += 1
                kinds.append(entry["kind"])
                times.append(entry["t"])
                if entry["kind"] == "action":
                    assert "frame_before" in entry and "frame_after" in entry
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert received == len(lines) + 1000 and times == sorted(times)
    assert kinds.count("action") == 1002
    assert peak < size / 4, f"{peak / 1e6:.0f} MB held for a trajectory of {size / 1e6:.0f} MB"
    client.delete(f"/v1/sessions/{sid}/recording")


def test_bad_requests(client: httpx.Client, recorded: dict[str, Any]) -> None:
    sid = recorded["id"]
    assert_error(client.get(f"/v1/sessions/{sid}/recording/frames/99999"), 404, "not_found")
    assert_error(client.get(f"/v1/sessions/{sid}/recording/frames/-1"), 404, "not_found")
    assert_error(client.get(f"/v1/sessions/{sid}/recording/frames/abc"), 422,
                 "invalid_request")
    assert_error(client.get("/v1/sessions/..%2F..%2Fetc/trajectory"), 404, "not_found")
    assert_error(client.post("/v1/sessions/nope/recording/start"), 404, "not_found")
    assert_error(client.post("/v1/sessions", json={"record": "yes"}), 422, "invalid_request")


def test_quota_and_expiry(tmp_path: Any) -> None:
    full = Settings(state_dir=tmp_path / "full", api_keys=[KEY_A], backends=["local"],
                    default_backend="local", recording_quota_mb=0)
    with running_server(full) as server, server.client() as client:
        assert_error(client.post("/v1/sessions", json={"record": True}), 429,
                     "quota_exceeded")
    brief = Settings(state_dir=tmp_path / "brief", api_keys=[KEY_A], backends=["local"],
                     default_backend="local", recording_ttl_h=1 / 3600,
                     reaper_interval_s=0.2)
    with running_server(brief) as server, server.client(KEY_A) as client:
        sid = client.post("/v1/sessions", json={"display": DISPLAY, "record": True}).json()["id"]
        assert client.post(f"/v1/sessions/{sid}/recording/stop").json()["state"] == "stopped"
        assert wait_for(lambda: client.get(f"/v1/sessions/{sid}/recording").status_code
                        == 404, timeout_s=5)
        client.delete(f"/v1/sessions/{sid}")


# Noise redrawn on every animation frame: each recorded frame is a JPEG of ~1 MB.
NOISE = ("data:text/html,<body style='margin:0'><canvas id=c width=1280 height=800></canvas>"
         "<script>const c=document.getElementById('c').getContext('2d');"
         "const d=c.createImageData(1280,800),w=new Uint32Array(d.data.buffer);let s=1;"
         "function f(){for(let i=0;i<w.length;i++){s^=s<<13;s^=s>>>17;s^=s<<5;"
         "w[i]=s|0xff000000}c.putImageData(d,0,0);requestAnimationFrame(f)}f()</script></body>")


@contextmanager
def recording_the_noise(
    tmp_path: Path, **settings: Any
) -> Iterator[tuple[Server, httpx.Client, str]]:
    """A server of the local engine with ``settings``, and a session of it on the NOISE
    page, recorded from when the noise fills the screen."""
    with running_server(Settings(state_dir=tmp_path / "state", api_keys=[KEY_A],
                                 backends=["local"], default_backend="local", **settings)
                        ) as server, server.client() as client:
        sid = client.post("/v1/sessions", json={
            "display": DISPLAY, "browser": {"start_url": NOISE}}).json()["id"]
        assert wait_for(lambda: len(client.get(
            f"/v1/sessions/{sid}/screenshot", params={"format": "jpeg"}).content)
            > 512 * 1024), "the noise page never filled the screen"
        assert client.post(f"/v1/sessions/{sid}/recording/start").status_code == 200
        yield server, client, sid


def test_frames_dropped_at_the_quota_are_not_counted(tmp_path: Any) -> None:
    """The first write of a recording goes past its key's quota and is dropped: the
    recording says it has no frame, and asking for one (or the video) is a 404. It counted
    the dropped frames, and both answered 500."""
    # Recording starts once the noise is on screen: a frame taken before the page drew is
    # small enough to fit the quota, and is rightly counted. At the default quality 60 a
    # frame of noise is near the quota (one fitted in a full run, and was rightly
    # counted); at 95 it is about 2.5 times that size.
    with recording_the_noise(tmp_path, recording_quota_mb=1, recording_quality=95) as (
            _, client, sid):
        try:
            recording = wait_for(lambda: (r := client.get(
                f"/v1/sessions/{sid}/recording").json())["state"] == "stopped" and r)
            assert recording, "the quota never stopped the recording"
            assert "quota" in recording["stop_reason"], recording
            assert recording["frames"] == 0, recording
            assert_error(client.get(f"/v1/sessions/{sid}/recording/frames/0"), 404,
                         "not_found")
            assert_error(client.get(f"/v1/sessions/{sid}/recording.mp4"), 404, "not_found")
        finally:
            client.delete(f"/v1/sessions/{sid}")


def test_a_video_is_kept_only_within_the_quota(tmp_path: Path) -> None:
    """The video made on request was kept beside the frames and counted nowhere: a
    recording stopped at its key's quota of 20 MiB took 36 MiB once its video was asked
    for. A video that does not fit is sent and not kept; one that fits is kept and
    counted, so the key's recordings stay within their quota on disk."""
    quota = 6 << 20
    with recording_the_noise(tmp_path, recording_quota_mb=6, recording_fps=12) as (
            server, client, sid):
        try:
            recording = wait_for(lambda: (r := client.get(
                f"/v1/sessions/{sid}/recording").json())["state"] == "stopped" and r,
                timeout_s=60)
            assert recording, "the quota never stopped the recording"
            directory = server.settings.state_dir / "recordings" / sid
            for _ in range(2):  # not kept: made again, and sent whole again
                video = client.get(f"/v1/sessions/{sid}/recording.mp4", timeout=300)
                assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
                assert int(video.headers["content-length"]) == len(video.content)
                with av.open(io.BytesIO(video.content)) as container:
                    decoded = list(container.decode(container.streams.video[0]))
                assert len(decoded) == recording["frames"] + 1  # the last held to the end
                kept = sum(f.stat().st_size for f in directory.rglob("*")
                           if f.is_file() and f.name != "meta.json")
                assert kept <= quota, f"{kept} bytes kept for a quota of {quota}"
                assert not list(directory.glob("video*"))
        finally:
            client.delete(f"/v1/sessions/{sid}")


def test_a_recording_deleted_while_its_video_is_made_is_gone(tmp_path: Path) -> None:
    """A delete during the video's encode took the frames from under the encoder: the
    request answered 502 session_failed, as if the sandbox had made unreadable frames,
    with the server's own path to the frame in the message. Now 404, as the recording
    is."""
    with recording_the_noise(tmp_path, recording_fps=12) as (server, client, sid):
        try:
            assert wait_for(lambda: client.get(
                f"/v1/sessions/{sid}/recording").json()["frames"] >= 24)
            directory = server.settings.state_dir / "recordings" / sid
            answers: list[httpx.Response] = []
            asking = threading.Thread(target=lambda: answers.append(
                client.get(f"/v1/sessions/{sid}/recording.mp4", timeout=120)))
            asking.start()
            try:
                assert wait_for(lambda: (directory / "video.partial.mp4").exists())
                assert client.delete(f"/v1/sessions/{sid}/recording").status_code == 204
            finally:
                asking.join()
            error = assert_error(answers[0], 404, "not_found")
            assert str(server.settings.state_dir) not in error["message"]
        finally:
            client.delete(f"/v1/sessions/{sid}")


def test_videos_asked_at_once_hold_up_no_other_request(tmp_path: Path) -> None:
    """Encodes ran on the loop's default executor, each request holding one of its threads
    (one encoding, the others waiting for their turn): a few video requests of a long
    recording held all of them for the whole encode, and every create and snapshot listing
    waited behind. Now the rest of the API answers meanwhile, and a second encode of one
    key is refused (429 capacity, Retry-After). The zip export, written whole into the
    state dir before it was sent, is now made as it is sent."""
    with recording_the_noise(tmp_path, recording_fps=12) as (server, client, sid):
        try:
            # Noise encodes at ~0.1-0.2 s a frame on 2 cores: 60 frames outlast the listing
            # and the create below several times over (150 took 45 s of the suite).
            assert wait_for(lambda: client.get(f"/v1/sessions/{sid}/recording").json()[
                "frames"] >= 60, timeout_s=120), "the recording did not get its frames"
        finally:
            client.delete(f"/v1/sessions/{sid}")  # its CPU back for what follows
        frames = client.get(f"/v1/sessions/{sid}/recording").json()["frames"]

        answers: list[tuple[httpx.Response, float]] = []

        def video() -> None:
            with server.client() as own:
                own.timeout = httpx.Timeout(600)
                answer = own.get(f"/v1/sessions/{sid}/recording.mp4")
                answers.append((answer, time.monotonic()))

        # More than the loop's default executor has threads (min(32, cores + 4)).
        asking = [threading.Thread(target=video)
                  for _ in range(min(32, (os.cpu_count() or 1) + 4) + 2)]
        for thread in asking:
            thread.start()
        time.sleep(1)  # the encode under way
        started = time.monotonic()
        listed = client.get("/v1/snapshots")
        listing_s = time.monotonic() - started
        created = client.post("/v1/sessions", json={"display": DISPLAY})
        create_s = time.monotonic() - started - listing_s
        answered = time.monotonic()
        for thread in asking:
            thread.join(600)
        assert listed.status_code == 200 and created.status_code == 201, created.text
        client.delete(f"/v1/sessions/{created.json()['id']}")
        assert listing_s < 2 and create_s < 10, (listing_s, create_s)

        made = [(r, at) for r, at in answers if r.status_code == 200]
        print(f"{frames} frames; listing {listing_s:.2f} s, create {create_s:.2f} s, "
              f"video {max(at for _, at in made) - started:.1f} s after them")
        assert len(made) == 1 and made[0][1] > answered, "the encode was over too soon to tell"
        for refused, _ in answers:
            if refused.status_code != 200:
                assert_error(refused, 429, "capacity")
                assert int(refused.headers["Retry-After"]) > 0
        with av.open(io.BytesIO(made[0][0].content)) as container:
            assert container.streams.video[0].frames == frames + 1  # the last one twice
        again = client.get(f"/v1/sessions/{sid}/recording.mp4")  # kept: at once
        assert again.status_code == 200 and again.content == made[0][0].content

        with client.stream("GET", f"/v1/sessions/{sid}/trajectory.zip") as export:
            assert export.status_code == 200
            chunks = export.iter_bytes()
            first = next(chunks)
            assert [p.name for p in server.settings.state_dir.rglob("*.zip")] == []
            data = first + b"".join(chunks)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            assert archive.testzip() is None
        assert len([n for n in names if n.startswith("frames/")]) == frames
        client.delete(f"/v1/sessions/{sid}/recording")


def test_starts_at_once_make_one_recording_that_stops(
    client: httpx.Client, server: Server,
) -> None:
    """Starts sent together once made a recorder each; a stop stopped the last, and the
    others took frames on for ever."""
    sid = client.post("/v1/sessions", json={
        "display": DISPLAY, "browser": {"start_url": NOISE}}).json()["id"]
    try:
        together = threading.Barrier(4)
        answers: list[int] = []

        def start() -> None:
            together.wait()
            answers.append(client.post(f"/v1/sessions/{sid}/recording/start").status_code)

        threads = [threading.Thread(target=start) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert answers == [200] * 4
        time.sleep(1)
        stopped = client.post(f"/v1/sessions/{sid}/recording/stop").json()
        assert stopped["state"] == "stopped"
        frames = server.settings.state_dir / "recordings" / sid / "frames"
        written = len(list(frames.iterdir()))
        time.sleep(2)  # 8 frames at 4 a second, were a recorder still taking them
        assert len(list(frames.iterdir())) == written == stopped["frames"]
    finally:
        client.delete(f"/v1/sessions/{sid}")
        client.delete(f"/v1/sessions/{sid}/recording")


# A clock redrawn ten times a second: frames keep coming, at little CPU.
TICKING = ("data:text/html,<body style='margin:0;font-size:60px'><p id=t></p><script>"
           "setInterval(()=>document.getElementById('t').textContent=Date.now(),100)"
           "</script></body>")


def test_a_start_during_a_stop_records_on(
    client: httpx.Client, server: Server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start that came while a stop was ending the recording began a new recorder on
    the same recording, which the stop then marked stopped (expiring, its directory later
    deleted under the recorder still writing). The start now waits for the stop."""
    close = Recorder.close

    async def held(self: Recorder) -> None:
        await asyncio.sleep(0.5)  # the stop under way a moment longer (our seam)
        await close(self)

    monkeypatch.setattr(Recorder, "close", held)
    sid = client.post("/v1/sessions", json={
        "display": DISPLAY, "record": True, "browser": {"start_url": TICKING}}).json()["id"]
    try:
        stopped: list[httpx.Response] = []
        stopping = threading.Thread(target=lambda: stopped.append(
            client.post(f"/v1/sessions/{sid}/recording/stop")))
        stopping.start()
        time.sleep(0.2)
        started = client.post(f"/v1/sessions/{sid}/recording/start")
        stopping.join(30)
        assert stopped[0].status_code == 200 and stopped[0].json()["state"] == "stopped"
        assert started.status_code == 200 and started.json()["state"] == "recording"

        time.sleep(2)
        recording = client.get(f"/v1/sessions/{sid}/recording").json()
        assert recording["state"] == "recording" and recording["expires_at"] is None
        assert wait_for(lambda: client.get(f"/v1/sessions/{sid}/recording").json()[
            "frames"] > recording["frames"]), "no frame came after the start"
        events = [e["event"]["type"] for e in trajectory(client, sid) if e["kind"] == "event"]
        assert events[-2:] == ["recording_stopped", "recording_started"]
    finally:
        client.delete(f"/v1/sessions/{sid}")
        client.delete(f"/v1/sessions/{sid}/recording")


def test_saves_at_once_each_write_the_whole_record(tmp_path: Path) -> None:
    """A recorder's flush and its stop write meta.json at once: both wrote one fixed
    temporary name, and the second rename found nothing (FileNotFoundError, a 500)."""
    store = RecordingStore(tmp_path, timedelta(hours=1))
    store.open()
    meta = store.begin("key", "ses_0123456789")
    failures: list[OSError] = []

    def save() -> None:
        try:
            for _ in range(300):
                store.save(meta)
        except OSError as error:
            failures.append(error)

    savers = [threading.Thread(target=save) for _ in range(4)]
    for saver in savers:
        saver.start()
    for saver in savers:
        saver.join(60)
    assert failures == []
    directory = store.directory(meta.session_id)
    assert RecordingMeta.model_validate_json((directory / "meta.json").read_bytes()) == meta
    assert sorted(p.name for p in directory.iterdir()) == ["frames", "meta.json", "shots"]


def test_a_killed_servers_unfinished_video_is_removed_at_start(tmp_path: Path) -> None:
    """An encode a killed server left (video.partial.mp4) counted nowhere, and took its
    room on disk until the next encode of that recording."""
    store = RecordingStore(tmp_path, timedelta(hours=1))
    store.open()
    meta = store.begin("key", "ses_0123456789")
    store.save(meta)
    (store.directory(meta.session_id) / "video.partial.mp4").write_bytes(b"\0" * 4096)
    again = RecordingStore(tmp_path, timedelta(hours=1))
    again.open()
    assert sorted(p.name for p in again.directory(meta.session_id).iterdir()) == [
        "frames", "meta.json", "shots"]


def test_a_humans_rfb_input_reads_as_actions() -> None:
    """Drag, wheel, combos and the typing pause, from the raw messages a viewer sends."""
    done: list[HumanAction] = []
    clock = [0.0]
    viewer = HumanInput(done.append, lambda: clock[0])

    def pointer(mask: int, x: int, y: int) -> None:
        viewer.message(struct.pack(">BBHH", 5, mask, x, y))

    def key(keysym: int, down: bool = True) -> None:
        viewer.message(struct.pack(">BBHI", 4, down, 0, keysym))

    pointer(1, 20, 20)
    pointer(1, 120, 90)
    pointer(0, 200, 200)  # released far from the press: a drag
    pointer(8, 5, 5)
    pointer(0, 5, 5)
    pointer(8, 5, 5)  # two notches up at one place: one scroll
    key(ord("H"))
    key(ord("i"))
    clock[0] = 2.0
    viewer.tick()  # the pause ends the typing
    key(0xFFE3)
    key(ord("c"))
    key(0xFFE3, down=False)
    key(0xFF56)
    key(0x1000000 + ord("ж"))
    viewer.flush()
    assert [d.action for d in done] == [
        {"type": "drag", "path": [[20, 20], [200, 200]], "button": "left"},
        {"type": "scroll", "x": 5, "y": 5, "dy": -2},
        {"type": "type", "text": "Hi"},
        {"type": "key", "keys": "ctrl+c"},
        {"type": "key", "keys": "Page_Down"},
        {"type": "type", "text": "ж"},
    ]


def test_a_viewer_that_types_without_a_pause_is_recorded_in_bounded_parts() -> None:
    """Its text grew in memory until it paused, into one ``type`` of any length (the API
    takes 20,000 characters a ``type``)."""
    done: list[HumanAction] = []
    viewer = HumanInput(done.append, lambda: 0.0)
    for _ in range(45_000):
        viewer.message(struct.pack(">BBHI", 4, True, 0, ord("a")))
    viewer.flush()
    assert [len(d.action["text"]) for d in done] == [20_000, 20_000, 5_000]


def test_a_hostile_frame_is_a_clear_error_not_a_crash(
    client: httpx.Client, server: Server
) -> None:
    """Frames are a sandbox's JPEGs: the video is encoded in a confined process of its own,
    and a frame that is not what it should be fails that process, not the server."""
    sid = client.post("/v1/sessions", json={"display": DISPLAY, "record": True}).json()["id"]
    try:
        assert client.post(f"/v1/sessions/{sid}/recording/stop").status_code == 200
        frame = server.settings.state_dir / "recordings" / sid / "frames" / "000000.jpg"
        frame.write_bytes(b"\xff\xd8\xff" + b"\x00" * 64)  # JPEG's magic, then nothing
        error = assert_error(client.get(f"/v1/sessions/{sid}/recording.mp4"), 502,
                             "session_failed")
        assert "could not be encoded" in error["message"]
        assert client.get("/healthz").status_code == 200
    finally:
        client.delete(f"/v1/sessions/{sid}")
        client.delete(f"/v1/sessions/{sid}/recording")


def test_a_pool_desktop_whose_recording_cannot_begin_is_not_left_running(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A create served by the warm pool whose recording could not begin (no room on the
    disk, or the key's quota filled meanwhile): the caller got the error and never the
    session's id, while the session ran on unseen, counted against the key's caps."""
    async def refused(*_: Any) -> Any:
        raise QuotaExceeded("the API key's recordings use their quota")

    settings = Settings(state_dir=tmp_path / "state", api_keys=[KEY_A], backends=["local"],
                        default_backend="local", pool_size=1, pool_displays=["640x400"])
    with running_server(settings) as server, server.client() as client:
        pool = server.services.manager.pool
        assert pool is not None
        assert wait_for(lambda: sum(pool.ready_by_display().values()) == 1, timeout_s=60)
        monkeypatch.setattr(Recordings, "begin", refused)
        created = client.post("/v1/sessions", json={
            "display": {"width": 640, "height": 400}, "record": True})
        assert_error(created, 429, "quota_exceeded")
        assert pool.claimed == 1  # it was the pool's desktop
        assert client.get("/v1/sessions", params={"state": "running"}).json()[
            "sessions"] == []
        assert wait_for(lambda: not server.services.manager.holding, timeout_s=15)


def test_a_batch_that_fails_midway_names_its_action_and_the_rest_are_skipped(
    client: httpx.Client, recorded: dict[str, Any]
) -> None:
    """An action the desktop cannot do (an unknown key name, found only when its turn
    comes) after one it did: the error names that action, in the answer and in the
    trajectory, and the action after it, which never ran, is kept as skipped (the error was
    put on the batch's last action, as if the bad key had been done)."""
    sid = recorded["id"]
    batch = [{"type": "move", "x": 30, "y": 30}, {"type": "key", "keys": "NoSuchKeyName"},
             {"type": "type", "text": "never"}]
    error = assert_error(client.post(f"/v1/sessions/{sid}/actions", json={"actions": batch}),
                         422, "invalid_request")
    assert error.get("action_index") == 1 and "NoSuchKeyName" in error["message"], error
    entries = trajectory(client, sid)
    moved, bad, never = [e for e in entries if e["kind"] == "action"][-3:]
    assert moved["action"] == batch[0] and "error" not in moved and "skipped" not in moved
    assert bad["error"]["type"] == "invalid_request" and "skipped" not in bad
    assert never["action"] == batch[2] and never["skipped"] is True and "error" not in never
    # The actions websocket: one action per message, so the failed one is its 0.
    with connect(recorded["urls"]["actions_ws"], compression=None, open_timeout=10,
                 additional_headers={"Authorization": f"Bearer {KEY_A}"}) as ws:
        ws.send(json.dumps({"id": 1, "action": {"type": "key", "keys": "NoSuchKeyName"}}))
        reply = json.loads(ws.recv(timeout=20))
    assert reply["ok"] is False and reply["error"]["action_index"] == 0, reply
