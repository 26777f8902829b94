"""``deskbox mcp`` through the MCP SDK's own stdio client, against a real server.

The client spawns the installed ``deskbox mcp`` as an MCP host would, and every check is
on what that host gets back: the tool list, JSON text, images that decode to the
display's size, text that lands in a real page (read through the browser's DevTools), and
errors as ``isError`` results that leave the server running.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import mcp.types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.stdio import get_default_environment
from PIL import Image

from deskbox import AsyncDeskbox
from deskbox.mcp_server import TOOL_NAMES
from deskbox_server.errors import DesktopFailed

from ..api.helpers import near
from ..cdp_page import CdpPage
from .conftest import KEY_A, Server

DESKBOX = str(Path(sys.executable).parent / "deskbox")
PAGE = (Path(__file__).parent / "pages" / "agent.html").as_uri()
WIDTH, HEIGHT = 800, 600  # the left field spans x 0..360, the right one 440..800
GREEN, BLUE = (0, 255, 0), (0, 0, 255)


@asynccontextmanager
async def mcp_client(server: Server, errlog: IO[str]) -> AsyncIterator[ClientSession]:
    env = {**get_default_environment(), "DESKBOX_URL": server.url, "DESKBOX_API_KEY": KEY_A}
    params = StdioServerParameters(command=DESKBOX, args=["mcp"], env=env)
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            yield client


async def call(client: ClientSession, name: str, **arguments: Any) -> types.CallToolResult:
    result = await client.call_tool(name, arguments)
    assert isinstance(result, types.CallToolResult), result
    return result


def ok_text(result: types.CallToolResult) -> str:
    assert not result.is_error, result.content
    block = result.content[0]
    assert isinstance(block, types.TextContent), block
    return block.text


def error_text(result: types.CallToolResult) -> str:
    assert result.is_error, result.content
    [block] = result.content
    assert isinstance(block, types.TextContent)
    return block.text


def image(block: Any, media_type: str = "image/png") -> Image.Image:
    assert isinstance(block, types.ImageContent), block
    assert block.mime_type == media_type
    decoded = Image.open(io.BytesIO(base64.b64decode(block.data)))
    assert decoded.format == media_type.split("/")[1].upper()
    return decoded.convert("RGB")


def field_values(server: Server, session_id: str, expected: dict[str, str]) -> dict[str, str]:
    """The page's two fields, read through DevTools until they are ``expected`` (≤ 5 s)."""
    devtools = server.handle(session_id).sandbox.devtools_url
    deadline = time.monotonic() + 10
    while True:
        try:
            cdp = CdpPage.first(devtools)
            break
        except DesktopFailed:
            assert time.monotonic() < deadline, "the session's browser has no page"
            time.sleep(0.05)
    with cdp:
        cdp.wait_painted(url_prefix="file:")
        deadline = time.monotonic() + 5
        while True:
            found: dict[str, str] = cdp.evaluate("({left: left.value, right: right.value})")
            if found == expected or time.monotonic() > deadline:
                return found
            time.sleep(0.02)


async def test_mcp_server_over_stdio(local_server: Server, tmp_path: Path) -> None:
    with (tmp_path / "mcp-stderr.log").open("w") as errlog:
        async with AsyncDeskbox(local_server.url, KEY_A) as box:
            created_ids: list[str] = []
            try:
                async with mcp_client(local_server, errlog) as client:
                    await _exercise(client, local_server, created_ids)
            finally:
                for session_id in created_ids:
                    await box.sessions.delete(session_id)


async def _exercise(client: ClientSession, server: Server, created_ids: list[str]) -> None:
    listed = await client.list_tools()
    names = {tool.name for tool in listed.tools}
    assert names == set(TOOL_NAMES)
    assert {"create_session", "click", "type", "key", "screenshot", "delete_session"} <= names
    click_tool = next(tool for tool in listed.tools if tool.name == "click")
    assert click_tool.description and "session_id" in click_tool.input_schema["required"]

    created = json.loads(ok_text(await call(
        client, "create_session", width=WIDTH, height=HEIGHT, start_url=PAGE,
        labels={"suite": "mcp"})))
    session_id = created["id"]
    created_ids.append(session_id)
    assert created["state"] == "running" and created["display"]["width"] == WIDTH
    await asyncio.to_thread(field_values, server, session_id, {"left": "", "right": ""})

    # Click into the left field, asking for the settled screen: it shows the field focused.
    clicked = await call(client, "click", session_id=session_id, x=150, y=300, screenshot=True)
    assert json.loads(ok_text(clicked)) == {"results": [{}]}
    shot = image(clicked.content[1])
    assert shot.size == (WIDTH, HEIGHT)
    assert near(shot.getpixel((150, 550)), GREEN) and near(shot.getpixel((700, 550)), BLUE)

    ok_text(await call(client, "type", session_id=session_id, text="hello mcp"))
    ok_text(await call(client, "key", session_id=session_id, keys="Return"))
    ok_text(await call(client, "type", session_id=session_id, text="second"))
    expected = {"left": "hello mcp\nsecond", "right": ""}
    assert await asyncio.to_thread(field_values, server, session_id, expected) == expected

    position = json.loads(ok_text(await call(client, "cursor_position", session_id=session_id)))
    assert position == {"results": [{"x": 150, "y": 300}]}

    screen = await call(client, "screenshot", session_id=session_id)
    assert not screen.is_error
    [block] = screen.content
    assert image(block).size == (WIDTH, HEIGHT)
    small = await call(client, "screenshot", session_id=session_id, format="jpeg", width=400,
                       height=300)
    assert image(small.content[0], "image/jpeg").size == (400, 300)

    # Errors are tool results with the Deskbox server's message; the server keeps going.
    missing = error_text(await call(client, "click", session_id="ses_does_not_exist", x=1, y=1))
    assert "404 not_found" in missing
    bad_key = error_text(await call(client, "key", session_id=session_id, keys="Hyper_Banana"))
    assert "422 invalid_request" in bad_key and "Hyper_Banana" in bad_key
    held = error_text(await call(client, "drag", session_id=session_id,
                                 path=[[10, 10], [20, 20]], modifiers=["Hyper_Banana"]))
    assert "422 invalid_request" in held and "Hyper_Banana" in held
    ok_text(await call(client, "move", session_id=session_id, x=20, y=30, modifiers=["shift"]))
    off_screen = error_text(await call(client, "move", session_id=session_id, x=5000, y=1))
    assert "outside" in off_screen
    wrong_type = await call(client, "move", session_id=session_id, x="left", y=1)
    assert wrong_type.is_error
    # An id that is not one path segment never reaches another route (a delete of
    # "<id>/control" handed a human's control back), nor does an empty one.
    for bad_id in (f"{session_id}/control", "", ".."):
        refused = error_text(await call(client, "delete_session", session_id=bad_id))
        assert "not an id or name" in refused, refused
    assert "cannot be scaled to 0x0" in error_text(await call(
        client, "screenshot", session_id=session_id, width=0, height=0))
    batch = await call(client, "act", session_id=session_id, actions=[
        {"type": "move", "x": 20, "y": 30}, {"type": "cursor_position"}])
    assert json.loads(ok_text(batch)) == {"results": [{}, {"x": 20, "y": 30}]}

    listed_sessions = json.loads(ok_text(await call(client, "list_sessions",
                                                    labels={"suite": "mcp"})))
    assert [s["id"] for s in listed_sessions] == [session_id]
    newest = json.loads(ok_text(await call(client, "list_sessions", limit=1)))
    assert [s["id"] for s in newest] == [session_id]
    shown = json.loads(ok_text(await call(client, "get_session", session_id=session_id)))
    assert shown["state"] == "running" and shown["labels"] == {"suite": "mcp"}
    assert "?token=" in ok_text(await call(client, "view_url", session_id=session_id))

    # Pause and resume: answered with the new state; the local engine (this server's)
    # cannot freeze, and says so as a tool error.
    paused = await call(client, "pause_session", session_id=session_id)
    if not paused.is_error:
        assert json.loads(ok_text(paused))["state"] == "paused"
        resumed = json.loads(ok_text(await call(client, "resume_session",
                                                session_id=session_id)))
        assert resumed["state"] == "running"
    else:
        assert ("422 invalid_request: pause mode \"freeze\" needs the capability 'freeze', "
                "which the local engine lacks") in error_text(paused)

    assert ok_text(await call(client, "delete_session", session_id=session_id)) == (
        f"deleted {session_id}")
    gone = json.loads(ok_text(await call(client, "get_session", session_id=session_id)))
    assert gone["state"] in ("stopping", "stopped")
    assert error_text(await call(client, "click", session_id=session_id, x=1, y=1))


async def test_mcp_server_reports_an_unreachable_deskbox(tmp_path: Path) -> None:
    """No Deskbox server at the URL: every call is a tool error, not a crash."""
    unreachable = Server("http://127.0.0.1:9", None, None)  # type: ignore[arg-type]
    with (tmp_path / "mcp-stderr.log").open("w") as errlog:
        async with mcp_client(unreachable, errlog) as client:
            failed = error_text(await call(client, "list_sessions"))
            assert "could not reach the Deskbox server" in failed
            assert error_text(await call(client, "screenshot", session_id="ses_x"))
            assert (await client.list_tools()).tools  # still answering

