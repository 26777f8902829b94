"""The host's AgentDesktop against agents whose desktop calls answer hostile replies.

Each agent is the real deskbox-agent server with ``act``, ``grab``, ``grab_deflated`` and
``info`` replaced by handlers that send a crafted reply over the real protocol (huge header
lengths, offsets past the body, images of the wrong size or format, a deflate bomb).
Every one must fail the agent's connection with AgentFailed and a reason, never hand the
caller bad data.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from deskbox_server.agent import AgentClient
from deskbox_server.agent.desktop import AgentDesktop
from deskbox_server.errors import AgentFailed, InvalidAction
from deskbox_server.schemas import actions as a

from .conftest import scripted_agent

HOSTILE_DESKTOP = """
import json, os, struct, sys, zlib
from deskbox_agent import __main__ as m
from deskbox_agent.registry import Blob, CallError

MODE = os.environ["HOSTILE_MODE"]
PARTS = "application/vnd.deskbox.parts"
PNG = b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0" * 100


def parts(header, data=b"", kind=PARTS):
    head = json.dumps(header).encode()
    return Blob(struct.pack(">I", len(head)) + head + data, kind)


def image(width, height, length=len(PNG), offset=0, media="image/png"):
    return {"type": "image", "media_type": media, "width": width, "height": height,
            "offset": offset, "length": length}


async def info(args):
    return {"display": ":9", "width": 1280, "height": 800, "capture": "xshm"}


async def act(args):
    if MODE == "huge_header":
        return Blob(struct.pack(">I", 0xFFFFFFF0) + b"{}", PARTS)
    if MODE == "header_past_body":
        return Blob(struct.pack(">I", 5000) + b"{}", PARTS)
    if MODE == "offset_past_body":
        return parts({"results": [image(640, 400, offset=10**9)], "settled": True,
                      "screenshot": None}, PNG)
    if MODE == "wrong_size":
        return parts({"results": [image(1280, 800)], "settled": True, "screenshot": None}, PNG)
    if MODE == "larger_than_asked":
        big = PNG + b"\\0" * (640 * 400 * 4 + 65 * 1024)
        return parts({"results": [image(640, 400, len(big))], "settled": True,
                      "screenshot": None}, big)
    if MODE == "not_png":
        return parts({"results": [image(640, 400)], "settled": True, "screenshot": None},
                     b"\\xff\\xd8\\xff" + PNG[3:])
    if MODE == "wrong_type":
        return parts({"results": [image(640, 400)], "settled": True, "screenshot": None}, PNG,
                     kind="application/json")
    if MODE == "missing_result":
        return parts({"results": [], "settled": True, "screenshot": None})
    if MODE == "bad_json":
        return Blob(struct.pack(">I", 3) + b"{x}", PARTS)
    if MODE.startswith("action_"):  # a refusal naming the action that failed
        index = {"action_ok": 0, "action_past": 1, "action_negative": -1, "action_text": "0",
                 "action_bool": True}[MODE]
        raise CallError(422, "invalid_action", "no such key", index)
    raise AssertionError(MODE)


async def grab(args):
    # Claims the right size, sends one byte less than its pixels.
    return parts({"width": 1280, "height": 800, "pixel_format": "bgrx",
                  "pixels": {"offset": 0, "length": 1280 * 800 * 4 - 1}},
                 b"\\0" * (1280 * 800 * 4 - 1))


async def grab_deflated(args):
    size = 1280 * 800 * 4
    if MODE == "deflate_bomb":  # 1 GB of zeros in a megabyte
        data = zlib.compress(bytes(1 << 30), 9)
    elif MODE == "deflate_short":
        data = zlib.compress(bytes(size - 1))
    elif MODE == "deflate_garbage":
        data = b"\x78\x01" + os.urandom(4096)
    else:
        raise AssertionError(MODE)
    return parts({"width": 1280, "height": 800, "pixel_format": "bgrx",
                  "encoding": "deflate", "pixels": {"offset": 0, "length": len(data)}}, data)


registry = m.default_registry()
for name, handler in (("info", info), ("act", act), ("grab", grab)):
    registry.register(name, handler)
if MODE.startswith("deflate"):
    registry.register("grab_deflated", grab_deflated)
m.default_registry = lambda: registry
sys.exit(m.main(sys.argv[1:]))
"""


@pytest.fixture
def hostile_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    with scripted_agent(HOSTILE_DESKTOP, request.param, tmp_path / "hostile.sock") as socket_path:
        yield socket_path


@pytest_asyncio.fixture(loop_scope="function")
async def hostile(hostile_socket: Path) -> AsyncIterator[AgentDesktop]:
    client = await AgentClient.connect_unix(str(hostile_socket))
    try:
        yield AgentDesktop(client)
    finally:
        await client.close()


SHOT = a.Screenshot(format="png")
VIEW = a.CoordinateSpace(width=640, height=400)


@pytest.mark.parametrize(
    ("hostile_socket", "reason"),
    [
        ("huge_header", r"header of 4294967280 bytes \(at most 1048576"),
        ("header_past_body", r"header of 5000 bytes .* within the 6-byte body"),
        ("offset_past_body", r"results\[0\]: 108 bytes at 1000000000"),
        ("wrong_size", r"results\[0\]: not the 640x400 image/png asked for"),
        ("larger_than_asked", r"results\[0\]: 1090668 bytes at 0 \(at most 1089536"),
        ("not_png", r"results\[0\]: the bytes are not image/png"),
        ("wrong_type", r"answered 'application/json', not application/vnd.deskbox.parts"),
        ("missing_result", r"results is not a list of 1"),
        ("bad_json", r"header is not JSON"),
    ],
    indirect=["hostile_socket"],
)
async def test_a_malformed_act_reply_fails_the_agent(hostile: AgentDesktop, reason: str) -> None:
    with pytest.raises(AgentFailed, match=reason):
        await hostile.run([SHOT], VIEW)
    # The connection is done for: every later call says so at once.
    with pytest.raises(AgentFailed):
        await hostile.info()


@pytest.mark.parametrize(
    ("hostile_socket", "index"),
    [("action_ok", 0), ("action_past", None), ("action_negative", None), ("action_text", None),
     ("action_bool", None)],
    indirect=["hostile_socket"],
)
async def test_a_refusals_action_is_taken_only_if_it_is_one_of_the_batch(
    hostile: AgentDesktop, index: int | None,
) -> None:
    """The agent's word on which action failed goes into the API's error (and the
    recording): only an index of the batch the host sent is believed."""
    with pytest.raises(InvalidAction, match="no such key") as refused:
        await hostile.run([SHOT], VIEW)
    assert refused.value.action_index == index
    assert (await hostile.info()).width == 1280  # a refusal: the agent is fine


@pytest.mark.parametrize("hostile_socket", ["wrong_size"], indirect=True)
async def test_a_short_grab_fails_the_agent(hostile: AgentDesktop) -> None:
    with pytest.raises(AgentFailed, match=r"grab: 4095999 bytes for 1280x800 pixels"):
        await hostile.grab()


@pytest.mark.parametrize(
    "hostile_socket", ["deflate_bomb", "deflate_short", "deflate_garbage"], indirect=True)
async def test_a_deflated_grab_that_is_not_the_screen_fails_the_agent(
    hostile: AgentDesktop,
) -> None:
    with pytest.raises(AgentFailed,
                       match=r"grab: the deflated pixels are not 4096000 bytes \(1280x800\)"):
        await hostile.grab()
