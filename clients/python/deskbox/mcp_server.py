"""``deskbox mcp``: a Model Context Protocol server, over stdio, for a Deskbox server.

An MCP client (Claude Desktop, an IDE, an agent framework) starts ``deskbox mcp`` and gets
tools to create, list, pause, resume and delete sessions, to act on them (``click``,
``type``, ``key``, ``scroll``, ``drag``, ...; ``act`` for any batch of API.md actions),
and ``screenshot``, which answers with an MCP image. Every action tool takes
``screenshot: true`` to answer with the screen as it is once it has settled.

The Deskbox server is found like the CLI finds it (``--url`` / ``DESKBOX_URL``,
``--api-key`` / ``DESKBOX_API_KEY``). Errors the Deskbox server answers (an unknown
session, a paused one, an invalid action) become tool errors (``isError``) that carry its
message; the MCP server keeps running. Sessions outlive the MCP server: delete them with
``delete_session``, or let their idle timeout end them.
"""

from __future__ import annotations

import base64
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent
from pydantic import Field

from . import __version__
from ._async import AsyncDeskbox, AsyncSession
from ._base import BACKEND_HELP, DEFAULT_TIMEOUT
from ._errors import DeskboxError
from ._models import ActionsResult, Screenshot

__all__ = ["TOOL_NAMES", "DeskboxTools", "build_server", "serve"]

INSTRUCTIONS = (
    "Deskbox gives you disposable Linux desktops with a browser. Create a session, look at "
    "it with screenshot, act with click/type/key/scroll (coordinates are screen pixels of "
    "the session's display), and delete the session when you are done."
)

P = ParamSpec("P")
R = TypeVar("R")
Content = list[TextContent | ImageContent]

SessionId = Annotated[str, Field(description="The session's id (ses_...).")]
X = Annotated[int | None, Field(description="Screen x in pixels; omit for the pointer's.")]
Y = Annotated[int | None, Field(description="Screen y in pixels; omit for the pointer's.")]
Button = Literal["left", "right", "middle", "back", "forward"]
Keys = Annotated[list[str] | None, Field(description="Keys held meanwhile, e.g. ['ctrl'].")]
Shot = Annotated[bool, Field(description="Answer with a screenshot once the screen settled.")]


def _tool_errors(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Deskbox errors → MCP tool errors (``isError``) carrying the server's message.

    MCPServer hides the text of any other exception from the client; these messages are
    meant for the model ("404 not_found: no session ses_x").
    """

    @functools.wraps(fn)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except DeskboxError as error:
            raise ToolError(str(error)) from error
        except ValueError as error:  # an argument the SDK refuses (an empty id)
            raise ToolError(str(error)) from error

    return call


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


def _image(data: bytes, media_type: str) -> ImageContent:
    encoded = base64.b64encode(data).decode("ascii")
    return ImageContent(type="image", data=encoded, mime_type=media_type)


def _results(done: ActionsResult) -> Content:
    results: list[Any] = [
        {"image": f"{r.width}x{r.height} {r.media_type}"} if isinstance(r, Screenshot) else r
        for r in done.results
    ]
    content: Content = [TextContent(type="text", text=_json({"results": results}))]
    content += [_image(r.data, r.media_type) for r in done.results if isinstance(r, Screenshot)]
    if done.screenshot is not None:
        content.append(_image(done.screenshot.data, done.screenshot.media_type))
    return content


def _drop_none(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


class DeskboxTools:
    """The MCP tools, as methods (each one's docstring is its description)."""

    def __init__(self, box: AsyncDeskbox) -> None:
        self._box = box

    def _session(self, session_id: str) -> AsyncSession:
        # A handle by id, without a GET first: the action's own answer says if it is gone.
        return AsyncSession(self._box, {"id": session_id})

    async def _act(self, session_id: str, action: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                   screenshot: bool) -> Content:
        shot = {"format": "png"} if screenshot else None
        return _results(await self._session(session_id).act(action, screenshot=shot))

    # -- sessions -------------------------------------------------------------------------

    async def create_session(
        self,
        width: Annotated[int | None, Field(description="Display width (pixels).")] = None,
        height: Annotated[int | None, Field(description="Display height (pixels).")] = None,
        start_url: Annotated[str | None, Field(description="Page the browser opens.")] = None,
        labels: Annotated[dict[str, str] | None, Field(description="Labels to set.")] = None,
        timeout_s: Annotated[int | None, Field(description="Idle timeout (seconds).")] = None,
        backend: Annotated[str | None, Field(description=BACKEND_HELP)] = None,
    ) -> str:
        """Create a desktop session and wait until it runs; returns it (id, display, urls)."""
        display = _drop_none(width=width, height=height)
        session = await self._box.sessions.create(
            display=display or None, start_url=start_url, labels=labels, timeout_s=timeout_s,
            backend=backend,
        )
        return _json(session.data.raw)

    async def list_sessions(
        self,
        state: Annotated[str | None, Field(description="Only sessions in this state.")] = None,
        labels: Annotated[dict[str, str] | None, Field(description="Required labels.")] = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="At most this many.")] = 50,
    ) -> str:
        """List sessions, newest first (id, state, display, labels, ...): the newest
        ``limit``, so that a key with thousands of ended sessions fits in a reply."""
        sessions = await self._box.sessions.list(state=state, labels=labels, limit=limit)
        return _json([s.data.raw for s in sessions])

    async def get_session(self, session_id: SessionId) -> str:
        """One session: its state, display size, labels and URLs."""
        return _json((await self._box.sessions.get(session_id)).data.raw)

    async def delete_session(self, session_id: SessionId) -> str:
        """Destroy a session (idempotent)."""
        await self._box.sessions.delete(session_id)
        return f"deleted {session_id}"

    async def pause_session(
        self, session_id: SessionId,
        mode: Annotated[Literal["freeze", "hibernate"], Field(
            description="freeze keeps memory; hibernate checkpoints to disk.")] = "freeze",
    ) -> str:
        """Pause a session; resume_session brings it back as it was."""
        session = await self._box.sessions.get(session_id)
        await (session.hibernate() if mode == "hibernate" else session.pause())
        return _json((await session.refresh()).data.raw)

    async def resume_session(self, session_id: SessionId) -> str:
        """Resume a paused or hibernated session."""
        session = await self._box.sessions.get(session_id)
        await session.resume()
        return _json((await session.refresh()).data.raw)

    async def view_url(
        self, session_id: SessionId,
        control: Annotated[bool, Field(description="A link that may send input.")] = False,
    ) -> str:
        """A link (with a fresh token) where a person can watch the desktop live."""
        session = await self._box.sessions.get(session_id)
        return await session.view_url("control" if control else "view")

    # -- actions --------------------------------------------------------------------------

    async def click(
        self, session_id: SessionId, x: X = None, y: Y = None, button: Button = "left",
        count: Annotated[int, Field(ge=1, le=3, description="2: double, 3: triple.")] = 1,
        modifiers: Keys = None, screenshot: Shot = False,
    ) -> Content:
        """Click at (x, y)."""
        action = _drop_none(type="click", x=x, y=y, button=button, count=count,
                            modifiers=modifiers)
        return await self._act(session_id, action, screenshot)

    async def double_click(
        self, session_id: SessionId, x: X = None, y: Y = None, screenshot: Shot = False,
    ) -> Content:
        """Double-click with the left button at (x, y)."""
        action = _drop_none(type="click", x=x, y=y, button="left", count=2)
        return await self._act(session_id, action, screenshot)

    async def move(self, session_id: SessionId, x: int, y: int, modifiers: Keys = None,
                   screenshot: Shot = False) -> Content:
        """Move the pointer to (x, y)."""
        action = _drop_none(type="move", x=x, y=y, modifiers=modifiers)
        return await self._act(session_id, action, screenshot)

    async def drag(
        self, session_id: SessionId,
        path: Annotated[list[tuple[int, int]], Field(
            min_length=2, description="Points [[x, y], ...] from press to release.")],
        button: Button = "left", modifiers: Keys = None, screenshot: Shot = False,
    ) -> Content:
        """Press at the first point, move through the others, release at the last."""
        action = _drop_none(type="drag", path=[list(p) for p in path], button=button,
                            modifiers=modifiers)
        return await self._act(session_id, action, screenshot)

    async def mouse_down(self, session_id: SessionId, x: X = None, y: Y = None,
                         button: Button = "left", screenshot: Shot = False) -> Content:
        """Press a mouse button (and keep it pressed)."""
        action = _drop_none(type="mouse_down", x=x, y=y, button=button)
        return await self._act(session_id, action, screenshot)

    async def mouse_up(self, session_id: SessionId, x: X = None, y: Y = None,
                       button: Button = "left", screenshot: Shot = False) -> Content:
        """Release a mouse button."""
        action = _drop_none(type="mouse_up", x=x, y=y, button=button)
        return await self._act(session_id, action, screenshot)

    async def type_text(
        self, session_id: SessionId,
        text: Annotated[str, Field(description="Any Unicode text.")], screenshot: Shot = False,
    ) -> Content:
        """Type text where the keyboard focus is."""
        return await self._act(session_id, {"type": "type", "text": text}, screenshot)

    async def key(
        self, session_id: SessionId,
        keys: Annotated[str, Field(description="A combo like 'ctrl+l', 'Enter', 'shift+Tab'.")],
        screenshot: Shot = False,
    ) -> Content:
        """Press a key combination (xdotool-style names)."""
        return await self._act(session_id, {"type": "key", "keys": keys}, screenshot)

    async def hold_key(
        self, session_id: SessionId, keys: str,
        duration_s: Annotated[float, Field(ge=0, le=30)], screenshot: Shot = False,
    ) -> Content:
        """Hold keys down for duration_s seconds."""
        action = {"type": "hold_key", "keys": keys, "duration_s": duration_s}
        return await self._act(session_id, action, screenshot)

    async def scroll(
        self, session_id: SessionId, x: X = None, y: Y = None,
        dx: Annotated[int, Field(description="Wheel notches right (negative: left).")] = 0,
        dy: Annotated[int, Field(description="Wheel notches down (negative: up).")] = 0,
        modifiers: Keys = None, screenshot: Shot = False,
    ) -> Content:
        """Turn the mouse wheel at (x, y)."""
        action = _drop_none(type="scroll", x=x, y=y, dx=dx, dy=dy, modifiers=modifiers)
        return await self._act(session_id, action, screenshot)

    async def wait(
        self, session_id: SessionId,
        ms: Annotated[int, Field(ge=0, le=60_000, description="Milliseconds.")] = 1000,
        screenshot: Shot = False,
    ) -> Content:
        """Wait (e.g. for a page to load)."""
        return await self._act(session_id, {"type": "wait", "ms": ms}, screenshot)

    async def cursor_position(self, session_id: SessionId) -> Content:
        """Where the pointer is: {"x", "y"}."""
        return await self._act(session_id, {"type": "cursor_position"}, False)

    async def act(
        self, session_id: SessionId,
        actions: Annotated[list[dict[str, Any]], Field(
            min_length=1, description="Deskbox API actions, run in order, e.g. "
            '[{"type": "click", "x": 10, "y": 20}, {"type": "key", "keys": "Enter"}].')],
        screenshot: Shot = False,
    ) -> Content:
        """Run a batch of Deskbox actions (any action of the API); stops at the first error."""
        return await self._act(session_id, actions, screenshot)

    async def screenshot(
        self, session_id: SessionId,
        format: Literal["png", "jpeg", "webp"] = "png",  # noqa: A002 (the API's name)
        width: Annotated[int | None, Field(description="Scale to this width.")] = None,
        height: Annotated[int | None, Field(description="Scale to this height.")] = None,
    ) -> ImageContent:
        """The screen now, as an image."""
        if (width is None) != (height is None):
            raise ToolError("give both width and height to scale the screenshot, or neither")
        if width is not None and height is not None and (width < 1 or height < 1):
            raise ToolError(f"a screenshot cannot be scaled to {width}x{height}")
        session = self._session(session_id)
        scale = (width, height) if width and height else None
        data = await session.screenshot(format=format, scale=scale)
        media_type = {"jpeg": "image/jpeg", "webp": "image/webp"}.get(format, "image/png")
        return _image(data, media_type)


#: Tool name → method name (``type`` is a builtin's name in Python, not in MCP).
TOOL_NAMES: dict[str, str] = {
    name: name for name in (
        "create_session", "list_sessions", "get_session", "delete_session", "pause_session",
        "resume_session", "view_url", "click", "double_click", "move", "drag", "mouse_down",
        "mouse_up", "key", "hold_key", "scroll", "wait", "cursor_position", "act",
        "screenshot",
    )
} | {"type": "type_text"}


def build_server(box: AsyncDeskbox) -> MCPServer:
    """The MCP server whose tools act through ``box``."""
    server: MCPServer = MCPServer(name="deskbox", instructions=INSTRUCTIONS,
                                  version=__version__)
    tools = DeskboxTools(box)
    for name, method in TOOL_NAMES.items():
        # Unstructured output: text (JSON) and images, what every MCP client shows.
        server.add_tool(_tool_errors(getattr(tools, method)), name=name,
                        structured_output=False)
    return server


async def _serve(url: str | None, api_key: str | None, call_timeout: float) -> None:
    async with AsyncDeskbox(url, api_key, timeout=call_timeout) as box:
        await build_server(box).run_stdio_async()


def serve(url: str | None = None, api_key: str | None = None,
          timeout: float = DEFAULT_TIMEOUT) -> None:
    """Run the MCP server on stdin/stdout until the client closes it."""
    import anyio

    anyio.run(_serve, url, api_key, timeout)
