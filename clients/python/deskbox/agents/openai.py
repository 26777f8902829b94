"""OpenAI's computer-use tool (Responses API ``computer_call``) on a session::

    import openai
    from deskbox import Deskbox
    from deskbox.agents import openai as cua

    with Deskbox() as box, box.sessions.create(start_url="https://example.org") as session:
        result = cua.run(openai.OpenAI(), session, "What is the page's heading?")
        print(result.text)

:func:`run` is a whole agent loop. For your own loop, :class:`ComputerTool` gives the tool
definition (``tools=[tool.definition]``) and turns each ``computer_call`` output item into
the input items that answer it (``tool.execute(item)``).

Both forms of the tool are understood: ``computer_use_preview`` (one ``action`` per call,
the display size in the tool definition) and ``computer`` (a batch of ``actions`` per call;
the model works in the pixels of the screenshots it is sent, which are :attr:`display`).

How a call runs: its action(s) go as they are to the server's ``/actions/openai`` endpoint
(:meth:`deskbox.Session.act_openai`), which translates them, acts, and answers with the
``computer_call_output`` carrying the screenshot taken once the screen has settled.
Coordinates and screenshots are in the model's display size: the server scales them
(``coordinate_space``).

A ``computer_call_output`` has no error field: when the server refuses an action (an
unknown key, a point off the screen, ...), :meth:`ComputerTool.execute` answers with the
screen as it is and adds a user message with the server's error, so the model can correct
itself. A server that cannot be reached raises :class:`~deskbox.APIConnectionError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol

from .._errors import APIError, DeskboxError
from .._models import OpenAIResult
from ._common import (
    DEFAULT_MAX_PIXELS,
    ImageFormat,
    RunResult,
    SessionLike,
    as_dict,
    fit_display,
    image_options,
)

__all__ = [
    "DEFAULT_MODEL",
    "ComputerTool",
    "Environment",
    "OpenAIClient",
    "SafetyCheckDeclined",
    "ToolType",
    "run",
]

ToolType = Literal["computer_use_preview", "computer"]
Environment = Literal["browser", "linux", "ubuntu", "windows", "mac"]
DEFAULT_MODEL = "computer-use-preview"

class _Responses(Protocol):
    # (*args, **kwargs) matches any signature: the SDK's fully typed create() fits.
    def create(self, *args: Any, **kwargs: Any) -> Any: ...


class OpenAIClient(Protocol):
    """What :func:`run` uses of a model client: ``openai.OpenAI()`` is one."""

    @property
    def responses(self) -> _Responses: ...


class SafetyCheckDeclined(DeskboxError):
    """The ``acknowledge`` callback declined a pending safety check: the call was not run."""

    def __init__(self, checks: list[dict[str, Any]]) -> None:
        names = ", ".join(str(c.get("code") or c.get("id")) for c in checks)
        super().__init__(f"safety checks declined: {names}")
        self.checks = checks


# -- the tool -----------------------------------------------------------------------------


class ComputerTool:
    """The computer tool of one session, told a display of :attr:`display` pixels.

    ``display`` defaults to the session's display shrunk to at most ``max_pixels``.
    ``acknowledge`` decides on each pending safety check (``{"id", "code", "message"}``):
    by default every check is acknowledged and echoed back; a callback that returns False
    makes :meth:`execute` raise :class:`SafetyCheckDeclined` without acting.
    """

    def __init__(
        self,
        session: SessionLike,
        *,
        tool_type: ToolType = "computer_use_preview",
        environment: Environment = "browser",
        display: tuple[int, int] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        image_format: ImageFormat = "png",
        acknowledge: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.session = session
        self.tool_type = tool_type
        self.environment = environment
        self.image_format = image_format
        self.acknowledge = acknowledge
        screen = (session.display.width, session.display.height)
        self.display = display or fit_display(*screen, max_pixels)
        # Always sent, also when it is the screen's size: a session made with a
        # coordinate_space of its own would otherwise scale the model's coordinates and
        # images to that space instead of the display the model was told.
        self._space = self.display

    @property
    def definition(self) -> dict[str, Any]:
        """For ``tools=[...]``."""
        if self.tool_type == "computer":
            return {"type": "computer"}
        return {
            "type": "computer_use_preview",
            "display_width": self.display[0],
            "display_height": self.display[1],
            "environment": self.environment,
        }

    def execute(self, call: Any) -> list[dict[str, Any]]:
        """A ``computer_call`` item (a dict, or the SDK's object) → the input items that
        answer it: its ``computer_call_output``, and a user message if the action failed."""
        item = as_dict(call)
        checks = [as_dict(check) for check in item.get("pending_safety_checks") or []]
        if self.acknowledge is not None:
            declined = [check for check in checks if not self.acknowledge(check)]
            if declined:
                raise SafetyCheckDeclined(declined)
        call_id = str(item.get("call_id") or "")
        # Only the action(s): the rest of the item (status, safety checks) is ours to answer.
        body: dict[str, Any] = {k: item[k] for k in ("call_id", "action", "actions") if k in item}
        failure: str | None = None
        try:
            done = self._act(body)
        except APIError as error:
            failure = str(error)
            # The call still needs its screenshot; if even that fails, the desktop is gone.
            done = self._act({"type": "screenshot"})
        output = {**done.output, "call_id": call_id}
        if checks:
            output["acknowledged_safety_checks"] = checks
        if failure is None:
            return [output]
        message = {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"The computer action failed: {failure}"}]}
        return [output, message]

    def _act(self, body: dict[str, Any]) -> OpenAIResult:
        return self.session.act_openai(body, coordinate_space=self._space,
                                       **image_options(self.image_format))


# -- the loop -----------------------------------------------------------------------------


def run(
    client: OpenAIClient,
    session: SessionLike,
    task: str,
    *,
    model: str = DEFAULT_MODEL,
    max_steps: int = 50,
    instructions: str | None = None,
    tool: ComputerTool | None = None,
    **options: Any,
) -> RunResult:
    """Ask ``model`` to do ``task`` on ``session`` until it answers without the tool.

    Each step is one ``client.responses.create(...)`` call (``options`` are passed on,
    e.g. ``reasoning={"summary": "concise"}``), chained with ``previous_response_id``,
    followed by the computer calls it asked for. ``truncation="auto"`` is sent unless
    ``options`` say otherwise (the preview model requires it).
    """
    tool = tool or ComputerTool(session)
    options.setdefault("truncation", "auto")
    if instructions is not None:
        options["instructions"] = instructions
    transcript: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = [{"role": "user", "content": task}]
    previous: str | None = None
    output: list[dict[str, Any]] = []
    for step in range(1, max_steps + 1):
        transcript.extend(inputs)
        chained = {"previous_response_id": previous} if previous else {}
        response = as_dict(client.responses.create(
            model=model, tools=[tool.definition], input=inputs, **chained, **options,
        ))
        previous = str(response.get("id") or "") or None
        output = [as_dict(item) for item in response.get("output") or []]
        transcript.extend(output)
        calls = [item for item in output if item.get("type") == "computer_call"]
        if not calls:
            return RunResult(_text(output), "done", step, transcript)
        inputs = []
        for call in calls:
            try:
                inputs.extend(tool.execute(call))
            except SafetyCheckDeclined:
                return RunResult(_text(output), "safety_check", step, transcript)
    return RunResult(_text(output), "max_steps", max_steps, transcript)


def _text(output: list[dict[str, Any]]) -> str:
    parts = [
        str(part.get("text", ""))
        for item in output if item.get("type") == "message"
        for part in item.get("content") or [] if part.get("type") == "output_text"
    ]
    return "\n".join(parts)
