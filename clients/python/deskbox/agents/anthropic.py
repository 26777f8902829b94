"""Anthropic's ``computer`` tool (``computer_20250124``, ``computer_20251124``) on a session::

    import anthropic
    from deskbox import Deskbox
    from deskbox.agents import anthropic as claude

    with Deskbox() as box, box.sessions.create(start_url="https://example.org") as session:
        result = claude.run(anthropic.Anthropic(), session, "What is the page's heading?")
        print(result.text)

:func:`run` is a whole agent loop. For your own loop, :class:`ComputerTool` gives the tool
definition (``tools=[tool.definition]``, ``betas=[tool.beta]``) and turns each ``tool_use``
block into its ``tool_result`` block (``tool.execute(block)``).

How a tool call runs: its ``input`` goes as it is to the server's ``/actions/anthropic``
endpoint (:meth:`deskbox.Session.act_anthropic`), which translates it, acts, and answers
with the ``tool_result`` content: the screenshot taken once the screen has settled, a
zoomed image, or the pointer position. Coordinates and screenshots are in the model's
display size (:attr:`ComputerTool.display`): the server scales them (``coordinate_space``).

Failures the model can act on (a malformed input, an unknown key, a point off the
screen, a paused or failed session: the server's error, :class:`~deskbox.APIError`)
come back as ``is_error`` tool results; a server that cannot be reached raises
:class:`~deskbox.APIConnectionError`, as there is nothing the model could do about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from .._errors import APIError
from ._common import (
    DEFAULT_MAX_PIXELS,
    ActionError,
    ImageFormat,
    RunResult,
    SessionLike,
    as_dict,
    fit_display,
    image_options,
)

__all__ = [
    "BETAS",
    "DEFAULT_MODEL",
    "AnthropicClient",
    "ComputerTool",
    "ToolVersion",
    "run",
]

ToolVersion = Literal["computer_20250124", "computer_20251124"]
#: The ``betas=[...]`` flag each tool version needs.
BETAS: dict[str, str] = {
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
}
DEFAULT_MODEL = "claude-sonnet-4-5"
OMITTED_IMAGE = "(an older screenshot, left out to save context)"


class _Messages(Protocol):
    # (*args, **kwargs) matches any signature: the SDK's fully typed create() fits.
    def create(self, *args: Any, **kwargs: Any) -> Any: ...


class _Beta(Protocol):
    @property
    def messages(self) -> _Messages: ...


class AnthropicClient(Protocol):
    """What :func:`run` uses of a model client: ``anthropic.Anthropic()`` is one."""

    @property
    def beta(self) -> _Beta: ...


def tool_error(tool_use_id: str, message: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "is_error": True,
            "content": [{"type": "text", "text": message}]}


# -- the tool -----------------------------------------------------------------------------


class ComputerTool:
    """The computer tool of one session, told a display of :attr:`display` pixels.

    ``display`` defaults to the session's display shrunk to at most ``max_pixels``
    (1366x768's worth: 1280x800 stays, 1920x1080 becomes 1366x768). ``enable_zoom`` lets
    ``computer_20251124`` models use ``zoom``. ``image_format`` is the screenshots' format.
    """

    name = "computer"

    def __init__(
        self,
        session: SessionLike,
        *,
        version: ToolVersion = "computer_20250124",
        display: tuple[int, int] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        image_format: ImageFormat = "png",
        enable_zoom: bool = False,
    ) -> None:
        if version not in BETAS:
            raise ValueError(f"unknown tool version {version!r}; known: {sorted(BETAS)}")
        self.session = session
        self.version = version
        self.image_format = image_format
        self.enable_zoom = enable_zoom
        screen = (session.display.width, session.display.height)
        self.display = display or fit_display(*screen, max_pixels)
        # Always sent, also when it is the screen's size: a session made with a
        # coordinate_space of its own would otherwise scale the model's coordinates and
        # images to that space instead of the display the model was told.
        self._space = self.display

    @property
    def definition(self) -> dict[str, Any]:
        """For ``tools=[...]``."""
        tool: dict[str, Any] = {
            "type": self.version,
            "name": self.name,
            "display_width_px": self.display[0],
            "display_height_px": self.display[1],
        }
        if self.enable_zoom and self.version == "computer_20251124":
            tool["enable_zoom"] = True
        return tool

    @property
    def beta(self) -> str:
        """For ``betas=[...]``."""
        return BETAS[self.version]

    def execute(self, tool_use: Any) -> dict[str, Any]:
        """A ``tool_use`` block (a dict, or the SDK's object) → its ``tool_result`` block."""
        block = as_dict(tool_use)
        tool_use_id = str(block.get("id") or "")
        if block.get("name", self.name) != self.name:
            return tool_error(tool_use_id, f"there is no tool named {block.get('name')!r}")
        tool_input = block.get("input")
        try:
            if not isinstance(tool_input, Mapping):
                raise ActionError(f"the tool input must be an object, got {tool_input!r}")
            content = self.run_input(tool_input)
        except (APIError, ActionError) as error:
            return tool_error(tool_use_id, str(error))
        return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}

    def run_input(self, tool_input: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run one tool ``input``; its ``tool_result`` content (raises on failure)."""
        done = self.session.act_anthropic(tool_input, coordinate_space=self._space,
                                          **image_options(self.image_format))
        return done.content


# -- the loop -----------------------------------------------------------------------------


def run(
    client: AnthropicClient,
    session: SessionLike,
    task: str,
    *,
    model: str = DEFAULT_MODEL,
    max_steps: int = 50,
    max_tokens: int = 4096,
    system: str | None = None,
    tool: ComputerTool | None = None,
    keep_images: int | None = None,
    **options: Any,
) -> RunResult:
    """Ask ``model`` to do ``task`` on ``session`` until it answers without the tool.

    Each step is one ``client.beta.messages.create(...)`` call (``options`` are passed on,
    e.g. ``thinking=...``) followed by the tool calls it asked for. ``keep_images`` keeps
    only that many of the latest screenshots in the conversation (older ones become a
    short text), which bounds the tokens a long task costs.
    """
    tool = tool or ComputerTool(session)
    if system is not None:
        options["system"] = system
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    content: list[dict[str, Any]] = []
    for step in range(1, max_steps + 1):
        response = as_dict(client.beta.messages.create(
            model=model, max_tokens=max_tokens, tools=[tool.definition], messages=messages,
            betas=[tool.beta], **options,
        ))
        content = [as_dict(block) for block in response.get("content") or []]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block.get("type") == "tool_use"]
        if not uses:
            return RunResult(_text(content), "done", step, messages)
        messages.append({"role": "user", "content": [tool.execute(use) for use in uses]})
        if keep_images is not None:
            _keep_latest_images(messages, keep_images)
    return RunResult(_text(content), "max_steps", max_steps, messages)


def _text(content: list[dict[str, Any]]) -> str:
    return "\n".join(str(b.get("text", "")) for b in content if b.get("type") == "text")


def _keep_latest_images(messages: list[dict[str, Any]], keep: int) -> None:
    """Replace all but the ``keep`` latest screenshots in tool results by a short text."""
    seen = 0
    for message in reversed(messages):
        blocks = message.get("content")
        if message.get("role") != "user" or not isinstance(blocks, list):
            continue
        for result in reversed(blocks):
            inner = result.get("content") if result.get("type") == "tool_result" else None
            if not isinstance(inner, list):
                continue
            for index in reversed(range(len(inner))):
                if inner[index].get("type") != "image":
                    continue
                seen += 1
                if seen > keep:
                    inner[index] = {"type": "text", "text": OMITTED_IMAGE}
