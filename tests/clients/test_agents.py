"""The agent adapters (``deskbox.agents``), driven by recorded vendor answers.

No vendor is called: a fake model client (the seam the adapters own: an object with the
SDK's ``create`` method) plays back answers recorded in the vendors' JSON shapes
(``recorded/``) and keeps every request it was sent. The tool calls run on a real session
of a real server showing ``pages/agent.html``: two tall text fields with a white gap, the
focused one green. What is checked is what a user would see: the text in the fields (read
through the browser's DevTools), the screenshots the model was sent, the errors it was told.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from deskbox import (
    AnthropicResult,
    AsyncDeskbox,
    Deskbox,
    Display,
    OpenAIResult,
    Session,
    UnprocessableEntity,
)
from deskbox.agents import RunResult, fit_display
from deskbox.agents import anthropic as claude
from deskbox.agents import openai as cua
from deskbox_server.errors import DesktopFailed

from ..api.helpers import near
from ..cdp_page import CdpPage
from .conftest import KEY_A, Server

HERE = Path(__file__).parent
RECORDED = HERE / "recorded"
AGENT_PAGE = (HERE / "pages" / "agent.html").as_uri()
SCREEN = {"width": 1280, "height": 800}
MODEL = (640, 400)  # the display the model is told: half the screen each way
WHITE, BLUE, GREEN = (255, 255, 255), (0, 0, 255), (0, 255, 0)
# Model-space spots (640x400): left field x < 288, the gap 288..352, right field x > 352.
LEFT_SPOT, GAP_SPOT, RIGHT_SPOT = (140, 350), (320, 350), (600, 350)


def recorded(name: str) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = json.loads((RECORDED / name).read_text())
    return answers


class Recorder:
    """``create(**request)``: the next recorded answer; every request kept, as JSON."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []

    def create(self, **request: Any) -> dict[str, Any]:
        # A copy: the loop goes on changing its lists after the call, as the SDK would not.
        self.requests.append(json.loads(json.dumps(request)))
        return self.answers.pop(0)


class FakeAnthropic:
    """``client.beta.messages.create(...)``, like ``anthropic.Anthropic()``."""

    class _Beta:
        def __init__(self, messages: Recorder) -> None:
            self.messages = messages

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.recorder = Recorder(answers)
        self.beta = self._Beta(self.recorder)


class FakeOpenAI:
    """``client.responses.create(...)``, like ``openai.OpenAI()``."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.recorder = Recorder(answers)
        self.responses = self.recorder


def png(data_b64: str) -> Image.Image:
    data = base64.b64decode(data_b64)
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.convert("RGB")


def tool_result_image(result: dict[str, Any]) -> Image.Image:
    """The screenshot of an Anthropic tool_result block, checked and decoded."""
    assert result["type"] == "tool_result" and not result.get("is_error"), result
    [block] = result["content"]
    assert block["type"] == "image"
    assert (block["source"]["type"], block["source"]["media_type"]) == ("base64", "image/png")
    return png(block["source"]["data"])


def call_output_image(item: dict[str, Any], call_id: str) -> Image.Image:
    """The screenshot of an OpenAI computer_call_output item, checked and decoded."""
    assert item["type"] == "computer_call_output" and item["call_id"] == call_id
    assert item["output"]["type"] == "computer_screenshot"
    url: str = item["output"]["image_url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return png(url.removeprefix(prefix))


# -- a real session showing the agent page -----------------------------------------------


class AgentPage:
    """The session's page, read and reset through the browser's DevTools."""

    def __init__(self, cdp: CdpPage) -> None:
        self.cdp = cdp

    def values(self) -> dict[str, str]:
        values: dict[str, str] = self.cdp.evaluate(
            "({left: left.value, right: right.value})")
        return values

    def wait_values(self, expected: dict[str, str], timeout_s: float = 5.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while (found := self.values()) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    def reset(self) -> None:
        self.cdp.evaluate(
            "for (const f of document.querySelectorAll('textarea')) { f.value = ''; f.blur(); }")


@pytest.fixture(scope="module")
def box(local_server: Server) -> Iterator[Deskbox]:
    with Deskbox(local_server.url, KEY_A) as client:
        yield client


@pytest.fixture(scope="module")
def session(box: Deskbox) -> Iterator[Session]:
    with box.sessions.create(display=SCREEN, start_url=AGENT_PAGE,
                             labels={"suite": "agents"}) as created:
        yield created


@pytest.fixture(scope="module")
def page(local_server: Server, session: Session) -> Iterator[AgentPage]:
    devtools = local_server.handle(session.id).sandbox.devtools_url
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
        yield AgentPage(cdp)


@pytest.fixture
def fresh(page: AgentPage) -> AgentPage:
    """Both fields empty, neither focused."""
    page.reset()
    assert page.wait_values({"left": "", "right": ""}) == {"left": "", "right": ""}
    return page


# -- Anthropic -----------------------------------------------------------------------------


def test_anthropic_loop_on_a_real_page(session: Session, fresh: AgentPage) -> None:
    answers = recorded("anthropic_messages.json")
    model = FakeAnthropic(answers)
    tool = claude.ComputerTool(session, display=MODEL)
    result = claude.run(model, session, "Type 'hello from claude' in the right-hand field.",
                        model="claude-sonnet-4-5", tool=tool)

    # What the user sees: the text is in the right field (the click at model (480, 200) was
    # scaled to the screen's (960, 400); unscaled it would have landed in the left one).
    assert fresh.wait_values({"left": "", "right": "hello from claude"}) == {
        "left": "", "right": "hello from claude"}
    assert result.stop_reason == "done" and result.steps == len(answers)
    assert result.text == 'I typed "hello from claude" into the text area on the right.'

    requests = model.recorder.requests
    assert len(requests) == len(answers)
    for request in requests:
        assert request["model"] == "claude-sonnet-4-5" and request["max_tokens"] == 4096
        assert request["tools"] == [{"type": "computer_20250124", "name": "computer",
                                     "display_width_px": 640, "display_height_px": 400}]
        assert request["betas"] == ["computer-use-2025-01-24"]
    assert requests[0]["messages"] == [
        {"role": "user", "content": "Type 'hello from claude' in the right-hand field."}]

    def results(step: int) -> list[dict[str, Any]]:
        """The tool results sent with request ``step``, each for its tool_use block."""
        messages = requests[step]["messages"]
        assert len(messages) == 2 * step + 1
        asked = messages[-2]
        assert asked == {"role": "assistant", "content": answers[step - 1]["content"]}
        sent = messages[-1]
        assert sent["role"] == "user"
        ids = [b["id"] for b in asked["content"] if b["type"] == "tool_use"]
        assert [r["tool_use_id"] for r in sent["content"]] == ids
        content: list[dict[str, Any]] = sent["content"]
        return content

    # The first screenshot: in model space, both fields blue, nothing focused.
    first = tool_result_image(results(1)[0])
    assert first.size == MODEL
    assert near(first.getpixel(LEFT_SPOT), BLUE) and near(first.getpixel(RIGHT_SPOT), BLUE)
    assert near(first.getpixel(GAP_SPOT), WHITE)
    # After the click, the settled screenshot shows the right field focused (green).
    clicked = tool_result_image(results(2)[0])
    assert clicked.size == MODEL
    assert near(clicked.getpixel(RIGHT_SPOT), GREEN) and near(clicked.getpixel(LEFT_SPOT), BLUE)
    for step in (3, 4, 5):  # type, key "ctrl+a BackSpace", type: each answered by the screen
        assert tool_result_image(results(step)[0]).size == MODEL

    # Two failed calls in one turn: both answered as errors, and the loop went on.
    off_screen, unknown = results(6)
    assert off_screen["is_error"] is True and unknown["is_error"] is True
    assert "outside the 640x400 screen" in off_screen["content"][0]["text"]
    # The server's 422, as it answered: the unknown action and the ones there are.
    told = unknown["content"][0]["text"]
    assert told.startswith("422 invalid_request:") and "'teleport'" in told
    assert "'left_click'" in told and "'cursor_position'" in told
    # The pointer is where the scaled click left it, reported in model space.
    [position] = results(7)
    assert position["content"] == [{"type": "text", "text": "X=480,Y=200"}]


def test_anthropic_execute_in_your_own_loop(session: Session, fresh: AgentPage) -> None:
    """``execute`` alone, with SDK-shaped objects; the default display is the screen's."""
    tool = claude.ComputerTool(session, version="computer_20251124", enable_zoom=True)
    assert tool.display == (1280, 800)  # 1280x800 is within the default limit
    assert tool.definition == {"type": "computer_20251124", "name": "computer",
                               "display_width_px": 1280, "display_height_px": 800,
                               "enable_zoom": True}
    assert tool.beta == "computer-use-2025-11-24"

    clicked = tool.execute(ToolUse(id="toolu_1", input={"action": "triple_click",
                                                         "coordinate": [150, 400]}))
    assert near(tool_result_image(clicked).getpixel((200, 700)), GREEN)
    typed = tool.execute({"type": "tool_use", "id": "toolu_2", "name": "computer",
                          "input": {"action": "type", "text": "zoomed"}})
    assert typed["tool_use_id"] == "toolu_2"
    assert fresh.wait_values({"left": "zoomed", "right": ""})["left"] == "zoomed"

    zoom = tool.execute({"id": "toolu_3", "name": "computer",
                         "input": {"action": "zoom", "region": [0, 300, 200, 400]}})
    image = tool_result_image(zoom)
    assert image.size == (200, 100) and near(image.getpixel((100, 50)), GREEN)

    wrong_tool = tool.execute({"id": "toolu_4", "name": "bash", "input": {"command": "ls"}})
    assert wrong_tool["is_error"] is True and "no tool named 'bash'" in str(wrong_tool)
    bad_input = tool.execute({"id": "toolu_5", "name": "computer",
                              "input": {"action": "left_click", "coordinate": "middle"}})
    assert bad_input["is_error"] is True
    told = bad_input["content"][0]["text"]
    assert told.startswith("422 invalid_request:") and "left_click.coordinate" in told


class ToolUse:
    """A stand-in for the SDK's ``BetaToolUseBlock``: a pydantic-like object."""

    def __init__(self, id: str, input: dict[str, Any]) -> None:  # noqa: A002
        self.fields = {"type": "tool_use", "id": id, "name": "computer", "input": input,
                       "caller": None}

    def model_dump(self, *, mode: str, exclude_none: bool) -> dict[str, Any]:
        assert mode == "json" and exclude_none
        return {k: v for k, v in self.fields.items() if v is not None}


# -- OpenAI --------------------------------------------------------------------------------


def test_openai_loop_on_a_real_page(session: Session, fresh: AgentPage) -> None:
    answers = recorded("openai_responses.json")
    model = FakeOpenAI(answers)
    tool = cua.ComputerTool(session, display=MODEL)
    result = cua.run(model, session, "Type 'hello from gpt' in the left field.", tool=tool)

    expected = {"left": "hello from gpt\nsecond line", "right": ""}
    assert fresh.wait_values(expected) == expected
    assert result.stop_reason == "done" and result.steps == len(answers)
    assert result.text == 'I typed "hello from gpt" and a second line into the left text field.'

    requests = model.recorder.requests
    assert len(requests) == len(answers)
    for request in requests:
        assert request["model"] == "computer-use-preview"
        assert request["tools"] == [{"type": "computer_use_preview", "display_width": 640,
                                     "display_height": 400, "environment": "browser"}]
        assert request["truncation"] == "auto"
    assert "previous_response_id" not in requests[0]
    assert requests[0]["input"] == [
        {"role": "user", "content": "Type 'hello from gpt' in the left field."}]
    for step in range(1, len(requests)):
        assert requests[step]["previous_response_id"] == answers[step - 1]["id"]

    def answered(step: int) -> list[dict[str, Any]]:
        """The input items of request ``step``: the answer to the previous computer_call."""
        [call] = [i for i in answers[step - 1]["output"] if i["type"] == "computer_call"]
        items: list[dict[str, Any]] = requests[step]["input"]
        call_output_image(items[0], call["call_id"])
        return items

    first = call_output_image(answered(1)[0], "call_zw3hDs6F6hkWcA3Ho6Fr2cUG")
    assert first.size == MODEL and near(first.getpixel(LEFT_SPOT), BLUE)
    # The click at model (140, 200) focused the left field: its screenshot shows it.
    clicked = call_output_image(answered(2)[0], "call_9Xb2GmHo2pJnVZkYhy7Jq1e3")
    assert near(clicked.getpixel(LEFT_SPOT), GREEN) and near(clicked.getpixel(RIGHT_SPOT), BLUE)
    # The pending safety check of the type call was acknowledged, echoed as it came.
    [typed] = answered(3)
    [check] = [i for i in answers[2]["output"] if i["type"] == "computer_call"][0][
        "pending_safety_checks"]
    assert typed["acknowledged_safety_checks"] == [check]
    # An unknown key: the call is still answered with the screen, and a message says why.
    output, message = answered(4)
    assert "acknowledged_safety_checks" not in output
    assert message["type"] == "message" and message["role"] == "user"
    [part] = message["content"]
    assert part["type"] == "input_text" and part["text"].startswith("The computer action failed")
    assert "SUPER_BANANA" in part["text"]
    assert [len(answered(step)) for step in (5, 6)] == [1, 1]


def test_openai_batched_actions_of_the_computer_tool(session: Session, fresh: AgentPage) -> None:
    """The GA ``computer`` tool: one call carries several actions, answered once."""
    answers = recorded("openai_batched.json")
    model = FakeOpenAI(answers)
    tool = cua.ComputerTool(session, tool_type="computer", display=MODEL)
    result = cua.run(model, session, "Type 'batched' on the right.", tool=tool,
                     reasoning={"summary": "concise"})
    expected = {"left": "", "right": "batchedA"}  # ["SHIFT", "A"] is shift+a
    assert fresh.wait_values(expected) == expected
    assert result.stop_reason == "done" and result.text == "Done."
    first, second = model.recorder.requests
    assert first["tools"] == second["tools"] == [{"type": "computer"}]
    assert first["reasoning"] == {"summary": "concise"}
    [output] = second["input"]
    image = call_output_image(output, "call_Ba7Ch3Dn9Ep2Fq8Gr4Hs0It6")
    assert image.size == MODEL and near(image.getpixel(RIGHT_SPOT), GREEN)


ANTHROPIC_MALFORMED = [
    {}, {"action": "fly"}, {"action": "mouse_move"}, {"action": "left_click", "coordinate": [1]},
    {"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1},
    {"action": "scroll", "scroll_direction": "up"}, {"action": "type"},
    {"action": "key", "text": "  "}, {"action": "hold_key", "text": "a"},
    {"action": "zoom", "region": [1, 2]}, {"action": "left_click", "coordinate": [True, 2]},
    {"action": "type", "text": 5}, {"action": "key", "text": "ctrl+a NOKEY"},
]


def test_anthropic_malformed_inputs_are_error_results(
    session: Session, fresh: AgentPage,
) -> None:
    """The server refuses them (422) before acting; the model gets its message, nothing ran."""
    tool = claude.ComputerTool(session, display=MODEL)
    tool.execute({"id": "toolu_f", "name": "computer",
                  "input": {"action": "left_click", "coordinate": list(LEFT_SPOT)}})
    for tool_input in ANTHROPIC_MALFORMED:
        result = tool.execute({"id": "toolu_x", "name": "computer", "input": tool_input})
        assert result["is_error"] is True and result["tool_use_id"] == "toolu_x", tool_input
        [told] = result["content"]
        assert told["type"] == "text" and told["text"].startswith("422 invalid_request:")
    assert fresh.values() == {"left": "", "right": ""}
    not_an_object = tool.execute({"id": "toolu_y", "name": "computer", "input": ["click"]})
    assert not_an_object["is_error"] is True
    assert "must be an object" in not_an_object["content"][0]["text"]


OPENAI_MALFORMED = [
    {"type": "click", "button": "left"}, {"type": "teleport"},
    {"type": "drag", "path": [{"x": 1, "y": 1}]}, {"type": "keypress", "keys": []},
    {"type": "click", "button": "thumb", "x": 1, "y": 1},
    {"type": "move", "x": 1, "y": 1, "keys": ["HYPERSHIFT"]}, {"type": "type", "text": None},
]


def test_openai_malformed_actions_answer_the_screen_and_say_why(
    session: Session, fresh: AgentPage,
) -> None:
    tool = cua.ComputerTool(session, display=MODEL)
    tool.execute({"type": "computer_call", "call_id": "c0",
                  "action": {"type": "click", "button": "left", "x": 140, "y": 200}})
    for action in OPENAI_MALFORMED:
        output, message = tool.execute({"type": "computer_call", "call_id": "c1",
                                        "action": action})
        image = call_output_image(output, "c1")
        assert image.size == MODEL and near(image.getpixel(LEFT_SPOT), GREEN)
        [part] = message["content"]
        assert part["text"].startswith("The computer action failed: 422 invalid_request:")
    # A batch with one bad action runs none of them.
    output, message = tool.execute({"type": "computer_call", "call_id": "c2", "actions": [
        {"type": "type", "text": "zz"}, {"type": "keypress", "keys": ["NOKEY"]}]})
    assert "NOKEY" in message["content"][0]["text"]
    output, message = tool.execute({"type": "computer_call", "call_id": "c2", "actions": [
        {"type": "type", "text": "zz"}, {"type": "click", "button": "left", "x": MODEL[0],
                                         "y": 1}]})
    assert "is outside the" in message["content"][0]["text"]
    output, message = tool.execute({"type": "computer_call", "call_id": "c3"})
    assert "either action or actions" in message["content"][0]["text"]
    time.sleep(0.2)
    assert fresh.values() == {"left": "", "right": ""}


# -- the SDK's dialect calls, sync and async ------------------------------------------------


def test_the_adapters_keep_to_the_display_the_model_was_told(box: Deskbox) -> None:
    """A session made with a coordinate_space of its own: a model told the screen's size
    (the adapters' default) got images of that other space, and its clicks were mapped
    from it (a click past 1024 was refused, nearer ones landed elsewhere)."""
    with box.sessions.create(display=SCREEN, coordinate_space=(1024, 640)) as other:
        tool = claude.ComputerTool(other)
        assert tool.display == (1280, 800)
        [image] = tool.run_input({"action": "screenshot"})
        assert png(image["source"]["data"]).size == (1280, 800)
        tool.run_input({"action": "left_click", "coordinate": [1200, 700]})
        gpt = cua.ComputerTool(other)
        assert gpt.display == (1280, 800)
        shot = other.act_openai({"type": "screenshot"}, coordinate_space=gpt._space)
        assert shot.screenshot is not None
        assert (shot.screenshot.width, shot.screenshot.height) == (1280, 800)


def test_session_act_anthropic(session: Session, fresh: AgentPage) -> None:
    clicked = session.act_anthropic({"action": "left_click", "coordinate": list(RIGHT_SPOT)},
                                    coordinate_space=MODEL)
    assert clicked.settled is True and clicked.cursor is None
    assert clicked.screenshot is not None
    assert (clicked.screenshot.width, clicked.screenshot.height) == MODEL
    assert clicked.screenshot.media_type == "image/png"
    assert near(clicked.screenshot.image().convert("RGB").getpixel(RIGHT_SPOT), GREEN)
    # The content is the server's tool_result content, sent to the model as it is.
    [block] = clicked.content
    assert block["type"] == "image" and block["source"]["media_type"] == "image/png"
    assert png(block["source"]["data"]).size == MODEL

    session.act_anthropic({"action": "type", "text": "via sdk"})
    assert fresh.wait_values({"left": "", "right": "via sdk"})["right"] == "via sdk"
    where = session.act_anthropic({"action": "cursor_position"}, coordinate_space=MODEL)
    assert where.cursor == RIGHT_SPOT and where.screenshot is None and where.settled is None
    assert where.content == [{"type": "text", "text": f"X={RIGHT_SPOT[0]},Y={RIGHT_SPOT[1]}"}]
    shot = session.act_anthropic({"action": "screenshot"}, format="jpeg", quality=60)
    assert shot.screenshot is not None and shot.screenshot.media_type == "image/jpeg"
    assert (shot.screenshot.width, shot.screenshot.height) == (1280, 800)
    assert shot.screenshot.image().size == (1280, 800)

    with pytest.raises(UnprocessableEntity) as refused:
        session.act_anthropic({"action": "left_click", "coordinate": [700, 100]},
                              coordinate_space=MODEL)
    assert refused.value.type == "invalid_request"
    assert "outside the 640x400 screen" in refused.value.message


def test_session_act_openai(session: Session, fresh: AgentPage) -> None:
    done = session.act_openai(
        [{"type": "click", "button": "left", "x": 140, "y": 200},
         {"type": "type", "text": "batch"}, {"type": "keypress", "keys": ["SHIFT", "B"]}],
        call_id="call_1", coordinate_space=MODEL, format="webp", quality=90,
    )
    assert fresh.wait_values({"left": "batchB", "right": ""})["left"] == "batchB"
    assert done.settled is True and done.output["call_id"] == "call_1"
    assert done.output["output"]["image_url"].startswith("data:image/webp;base64,")
    assert done.screenshot.media_type == "image/webp"
    assert (done.screenshot.width, done.screenshot.height) == MODEL
    image = done.screenshot.image().convert("RGB")
    assert image.size == MODEL and near(image.getpixel(LEFT_SPOT), GREEN)
    # One bare action, and a whole computer_call item; a screenshot-only call.
    single = session.act_openai({"type": "wait"})
    assert "call_id" not in single.output and single.screenshot.width == 1280
    item = session.act_openai({"type": "computer_call", "call_id": "c9", "status": "completed",
                               "action": {"type": "screenshot"}})
    assert item.output["call_id"] == "c9" and item.settled is None
    assert call_output_image(item.output, "c9").size == (1280, 800)
    with pytest.raises(UnprocessableEntity) as refused:
        session.act_openai({"type": "keypress", "keys": ["SUPER_BANANA"]}, call_id="c")
    assert "unknown key name 'SUPER_BANANA'" in refused.value.message


async def test_async_session_act_dialects(
    local_server: Server, session: Session, fresh: AgentPage,
) -> None:
    async with AsyncDeskbox(local_server.url, KEY_A) as client:
        same = await client.sessions.get(session.id)
        clicked = await same.act_anthropic(
            {"action": "left_click", "coordinate": list(LEFT_SPOT)}, coordinate_space=MODEL,
            format="jpeg")
        assert clicked.screenshot is not None and clicked.screenshot.media_type == "image/jpeg"
        assert (clicked.screenshot.width, clicked.screenshot.height) == MODEL
        typed = await same.act_openai({"type": "type", "text": "async"}, call_id="a1")
        assert typed.output["call_id"] == "a1" and typed.settled is True
        assert (typed.screenshot.width, typed.screenshot.height) == (1280, 800)
        where = await same.act_anthropic({"action": "cursor_position"}, coordinate_space=MODEL)
        assert where.cursor == LEFT_SPOT
        with pytest.raises(UnprocessableEntity):
            await same.act_openai({"type": "teleport"})
    assert fresh.wait_values({"left": "async", "right": ""})["left"] == "async"


# -- offline: sizes, transcripts, safety checks ---------------------------------------------


FAKE_PNG = base64.b64encode(b"\x89PNG fake").decode("ascii")


class FakeSession:
    """A session at the adapters' seam (``display``, ``act_anthropic``, ``act_openai``):
    records every call, answers a fake PNG."""

    def __init__(self, width: int = 1280, height: int = 800) -> None:
        self.display = Display(width, height)
        self.calls: list[dict[str, Any]] = []

    def act_anthropic(self, tool_input: Any, **options: Any) -> AnthropicResult:
        self.calls.append({"input": tool_input, **options})
        return AnthropicResult.from_json([{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": FAKE_PNG}}], "true")

    def act_openai(self, action: Any, **options: Any) -> OpenAIResult:
        self.calls.append({"action": action, **options})
        return OpenAIResult.from_json({"type": "computer_call_output", "output": {
            "type": "computer_screenshot", "image_url": f"data:image/png;base64,{FAKE_PNG}"}})


def test_declined_safety_checks_stop_the_loop_without_acting() -> None:
    session = FakeSession()
    answers = recorded("openai_responses.json")[2:3]  # the call with a pending check
    seen: list[dict[str, Any]] = []

    def acknowledge(check: dict[str, Any]) -> bool:
        seen.append(check)
        return False

    tool = cua.ComputerTool(session, acknowledge=acknowledge)
    result = cua.run(FakeOpenAI(answers), session, "task", tool=tool)
    assert result.stop_reason == "safety_check" and result.steps == 1
    assert [c["code"] for c in seen] == ["malicious_instructions"]
    assert session.calls == []
    with pytest.raises(cua.SafetyCheckDeclined) as declined:
        tool.execute([i for i in answers[0]["output"] if i["type"] == "computer_call"][0])
    assert declined.value.checks == seen[:1]


def test_loops_stop_after_max_steps() -> None:
    session = FakeSession()
    looping = recorded("anthropic_messages.json")[1]  # a left_click, forever
    result = claude.run(FakeAnthropic([looping] * 3), session, "task", max_steps=3)
    assert result.stop_reason == "max_steps" and result.steps == 3
    assert len(session.calls) == 3 and result.transcript[-1]["role"] == "user"
    # The display the model was told, also the screen's own size: a session's own
    # coordinate_space would apply otherwise.
    assert session.calls[0]["coordinate_space"] == (1280, 800)
    gpt = recorded("openai_responses.json")[1]
    done = cua.run(FakeOpenAI([gpt] * 2), session, "task", max_steps=2)
    assert done.stop_reason == "max_steps" and done.steps == 2
    assert isinstance(done, RunResult) and done.transcript[0]["role"] == "user"


def test_keep_images_bounds_the_screenshots_in_the_conversation() -> None:
    session = FakeSession()
    answers = recorded("anthropic_messages.json")[:5]  # five calls, five screenshots
    model = FakeAnthropic([*answers, recorded("anthropic_messages.json")[-1]])
    result = claude.run(model, session, "task", keep_images=2, system="be brief")
    images = [
        inner for message in result.transcript if message["role"] == "user"
        and isinstance(message["content"], list) for block in message["content"]
        for inner in block["content"]
    ]
    assert [i["type"] for i in images] == ["text", "text", "text", "image", "image"]
    assert images[0]["text"] == claude.OMITTED_IMAGE
    assert model.recorder.requests[0]["system"] == "be brief"


def test_display_sizes_and_tool_definitions() -> None:
    assert fit_display(1280, 800) == (1280, 800)
    assert fit_display(1024, 768) == (1024, 768)
    assert fit_display(1920, 1080) == (1366, 768)
    assert fit_display(2560, 1440) == (1366, 768)
    for width, height in ((2560, 1600), (3840, 2160), (1000, 3000)):
        fitted = fit_display(width, height)
        assert fitted[0] * fitted[1] <= claude.DEFAULT_MAX_PIXELS
        assert abs(fitted[0] / fitted[1] - width / height) < 0.01
    with pytest.raises(ValueError):
        fit_display(0, 10)

    big = FakeSession(1920, 1080)
    tool = claude.ComputerTool(big)
    assert tool.definition["display_width_px"] == 1366 and tool.beta == "computer-use-2025-01-24"
    tool.execute({"id": "t", "name": "computer", "input": {"action": "mouse_move",
                                                            "coordinate": [1, 1]}})
    assert big.calls[-1] == {"input": {"action": "mouse_move", "coordinate": [1, 1]},
                             "coordinate_space": (1366, 768), "format": "png", "quality": None}
    with pytest.raises(ValueError):
        claude.ComputerTool(big, version="computer_20991231")  # type: ignore[arg-type]
    gpt = cua.ComputerTool(big, environment="linux", image_format="jpeg")
    assert gpt.definition == {"type": "computer_use_preview", "display_width": 1366,
                              "display_height": 768, "environment": "linux"}
    [output] = gpt.execute({"type": "computer_call", "call_id": "c", "status": "completed",
                            "action": {"type": "wait"}})
    assert big.calls[-1] == {"action": {"call_id": "c", "action": {"type": "wait"}},
                             "coordinate_space": (1366, 768), "format": "jpeg", "quality": 80}
    assert output["call_id"] == "c" and output["type"] == "computer_call_output"


def test_recorded_answers_are_read_like_sdk_objects() -> None:
    """The loops accept the SDKs' pydantic objects as well as dicts (``model_dump``)."""
    answers = [copy.deepcopy(a) for a in recorded("anthropic_messages.json")[-1:]]

    class Message:
        def __init__(self, data: dict[str, Any]) -> None:
            self.data = data

        def model_dump(self, *, mode: str, exclude_none: bool) -> dict[str, Any]:
            return {k: v for k, v in self.data.items() if v is not None}

    model = FakeAnthropic([])
    model.recorder.answers = [Message(a) for a in answers]  # type: ignore[misc]
    result = claude.run(model, FakeSession(), "task")
    assert result.stop_reason == "done" and "hello from claude" in result.text
    assert result.transcript[-1]["content"] == answers[0]["content"]
