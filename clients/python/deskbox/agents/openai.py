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

How a call runs: :func:`to_step` turns its action(s) into Deskbox actions, run by one
``session.act`` call that also returns the screenshot taken once the screen has settled.
The server has an ``/actions/openai`` endpoint for this dialect, but the SDK has no call
for it; going through ``act`` works over HTTP and over the actions websocket alike, and
runs the same translation the server's dialect does. Coordinates and screenshots are in
the model's display size: the server scales them (``coordinate_space``).

A ``computer_call_output`` has no error field: when an action fails (an unknown key, a
point off the screen, ...), :meth:`ComputerTool.execute` answers with the screen as it is
and adds a user message that says what failed, so the model can correct itself. A server
that cannot be reached raises :class:`~deskbox.APIConnectionError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from .._errors import APIError, DeskboxError
from .._models import Screenshot
from ._common import (
    DEFAULT_MAX_PIXELS,
    ActionError,
    ImageFormat,
    RunResult,
    SessionLike,
    Step,
    as_dict,
    b64,
    fit_display,
    integer,
    perform,
    screenshot_action,
    text,
)

__all__ = [
    "DEFAULT_MODEL",
    "PIXELS_PER_NOTCH",
    "WAIT_MS",
    "ComputerTool",
    "Environment",
    "OpenAIClient",
    "SafetyCheckDeclined",
    "ToolType",
    "key_name",
    "notches",
    "run",
    "to_step",
]

ToolType = Literal["computer_use_preview", "computer"]
Environment = Literal["browser", "linux", "ubuntu", "windows", "mac"]
DEFAULT_MODEL = "computer-use-preview"
#: ``scroll_x`` / ``scroll_y`` are pixels; the wheel moves in notches of about this much.
PIXELS_PER_NOTCH = 100
#: ``wait`` carries no duration: wait this long (as OpenAI's reference loop does).
WAIT_MS = 1000

_BUTTONS: dict[str, str] = {
    "left": "left", "right": "right", "wheel": "middle", "middle": "middle",
    "back": "back", "forward": "forward",
}


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


# -- translation --------------------------------------------------------------------------


def key_name(name: str) -> str:
    """An OpenAI key name (``CTRL``, ``ENTER``, ``ARROWLEFT``, ``A``) → a Deskbox one.

    Deskbox matches names without regard to case; a single letter is lowered so that it
    means its key (``["SHIFT", "A"]`` is shift+a, not a capital A's keysym).
    """
    if name == "+":
        return "plus"
    if name == " ":
        return "space"
    if len(name) == 1 and name.isalpha():
        return name.lower()
    return name.strip()


def notches(pixels: int) -> int:
    """Pixels → wheel notches, rounded away from zero (any scroll moves at least one)."""
    if not pixels:
        return 0
    return int(math.copysign(math.ceil(abs(pixels) / PIXELS_PER_NOTCH), pixels))


def _point(action: Mapping[str, Any]) -> dict[str, int]:
    return {"x": integer(action.get("x"), "x"), "y": integer(action.get("y"), "y")}


def _held(action: Mapping[str, Any]) -> dict[str, Any]:
    keys = action.get("keys")
    if not keys:
        return {}
    if not isinstance(keys, list):
        raise ActionError(f"keys must be a list of key names, got {keys!r}")
    return {"modifiers": [key_name(text(k, "keys")) for k in keys]}


def _translate(action: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One OpenAI action → Deskbox actions (none for ``screenshot``)."""
    kind = action.get("type")
    if kind == "click":
        button = _BUTTONS.get(str(action.get("button", "left")))
        if button is None:
            raise ActionError(f"unknown button {action.get('button')!r}")
        return [{"type": "click", "button": button, **_point(action), **_held(action)}]
    if kind == "double_click":
        return [{"type": "click", "button": "left", "count": 2, **_point(action),
                 **_held(action)}]
    if kind in ("move", "drag") and action.get("keys"):
        # Deskbox moves and drags hold no keys: say so rather than drop them silently.
        raise ActionError(f"holding keys during {kind} is not supported")
    if kind == "move":
        return [{"type": "move", **_point(action)}]
    if kind == "drag":
        path = action.get("path")
        if not isinstance(path, list) or len(path) < 2:
            raise ActionError(f"drag needs a path of at least two points, got {path!r}")
        points = [_point(p) if isinstance(p, Mapping) else {} for p in path]
        if not all(points):
            raise ActionError(f"drag path points must be {{'x', 'y'}} objects: {path!r}")
        return [{"type": "drag", "button": "left",
                 "path": [[p["x"], p["y"]] for p in points]}]
    if kind == "keypress":
        keys = action.get("keys")
        if not isinstance(keys, list) or not keys:
            raise ActionError(f"keypress needs a list of keys, got {keys!r}")
        # Pressed together, in order (then released in reverse): one Deskbox combo.
        return [{"type": "key", "keys": "+".join(key_name(text(k, "keys")) for k in keys)}]
    if kind == "type":
        return [{"type": "type", "text": text(action.get("text"), "text")}]
    if kind == "scroll":
        dx = notches(integer(action.get("scroll_x", 0), "scroll_x"))
        dy = notches(integer(action.get("scroll_y", 0), "scroll_y"))
        return [{"type": "scroll", **_point(action), "dx": dx, "dy": dy, **_held(action)}]
    if kind == "wait":
        return [{"type": "wait", "ms": WAIT_MS}]
    if kind == "screenshot":
        return []
    raise ActionError(f"unknown action type {kind!r}")


def call_actions(call: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The actions of a ``computer_call``: its ``action``, or its batch of ``actions``."""
    if isinstance(call.get("actions"), list):
        actions = call["actions"]
    elif call.get("action") is not None:
        actions = [call["action"]]
    else:
        raise ActionError("the computer_call has neither action nor actions")
    if not all(isinstance(action, Mapping) for action in actions):
        raise ActionError(f"every action must be an object, got {actions!r}")
    return list(actions)


def to_step(actions: Sequence[Mapping[str, Any]], image_format: ImageFormat = "png") -> Step:
    """Deskbox actions for a call's actions, answered by a settled screenshot (raises
    :class:`ActionError`); only a screenshot if none of them acts."""
    ours = tuple(step for action in actions for step in _translate(action))
    if not ours:
        return Step((screenshot_action(image_format),), "result")
    return Step(ours)


def image_url(shot: Screenshot) -> str:
    return f"data:{shot.media_type};base64,{b64(shot)}"


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
        self._space = None if self.display == screen else self.display

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
        failure: str | None = None
        try:
            shot = self._run(to_step(call_actions(item), self.image_format))
        except (APIError, ActionError) as error:
            failure = str(error)
            # The call still needs its screenshot; if even that fails, the desktop is gone.
            shot = self._run(Step((screenshot_action(self.image_format),), "result"))
        output: dict[str, Any] = {
            "type": "computer_call_output",
            "call_id": str(item.get("call_id") or ""),
            "output": {"type": "computer_screenshot", "image_url": image_url(shot)},
        }
        if checks:
            output["acknowledged_safety_checks"] = checks
        if failure is None:
            return [output]
        message = {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"The computer action failed: {failure}"}]}
        return [output, message]

    def _run(self, step: Step) -> Screenshot:
        answer = perform(self.session, step, self._space, self.image_format)
        if not isinstance(answer, Screenshot):
            raise ActionError("the server answered without a screenshot")
        return answer


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
