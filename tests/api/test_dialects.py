"""The vendor dialects: real tool inputs of Anthropic and OpenAI land exactly in the page.

Every action name of both vendors is sent as the vendor's model writes it; the checks are
on what the event-recording page received (position to the pixel, button, click count,
keys, text, wheel direction) and on the blocks returned (images decode to the right size).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
import pytest
from PIL import Image

from .conftest import EventPage
from .helpers import assert_error, decode, near

RED, GREEN, BLUE, PAD = (255, 0, 0), (0, 255, 0), (0, 0, 255), (238, 238, 238)
SCREEN = (1280, 800)
PX_PER_NOTCH = 120  # what Chromium on X11 reports for one wheel notch
MODIFIERS = ("ctrl", "shift", "alt", "meta")


def claude(
    client: httpx.Client, session: dict[str, Any], tool_input: dict[str, Any], **params: Any
) -> list[dict[str, Any]]:
    response = client.post(
        f"/v1/sessions/{session['id']}/actions/anthropic", json=tool_input, params=params
    )
    assert response.status_code == 200, response.text
    blocks: list[dict[str, Any]] = response.json()
    return blocks


def gpt(
    client: httpx.Client, session: dict[str, Any], body: dict[str, Any], **params: Any
) -> dict[str, Any]:
    response = client.post(
        f"/v1/sessions/{session['id']}/actions/openai", json=body, params=params
    )
    assert response.status_code == 200, response.text
    output: dict[str, Any] = response.json()
    return output


def block_image(blocks: list[dict[str, Any]], size: tuple[int, int] = SCREEN) -> Image.Image:
    """The one image block of a tool result, checked and decoded."""
    assert [b["type"] for b in blocks] == ["image"], blocks
    source = blocks[0]["source"]
    assert (source["type"], source["media_type"]) == ("base64", "image/png")
    image = decode(base64.b64decode(source["data"]))
    assert image.size == size
    return image


def output_image(
    output: dict[str, Any], call_id: str | None = None, media_type: str = "image/png"
) -> Image.Image:
    """The screenshot of a computer_call_output, checked and decoded."""
    expected_keys = {"type", "output"} | ({"call_id"} if call_id else set())
    assert set(output) == expected_keys, output
    assert output["type"] == "computer_call_output"
    assert output.get("call_id") == call_id
    assert output["output"]["type"] == "computer_screenshot"
    prefix = f"data:{media_type};base64,"
    url: str = output["output"]["image_url"]
    assert url.startswith(prefix)
    image = decode(base64.b64decode(url.removeprefix(prefix)))
    assert image.size == SCREEN
    return image


def client_xy(event: dict[str, Any]) -> tuple[int, int]:
    return event["clientX"], event["clientY"]


def held(event: dict[str, Any]) -> set[str]:
    return {name for name in MODIFIERS if event[name]}


@pytest.fixture(scope="module")
def origin(client: httpx.Client, session: dict[str, Any], page: EventPage) -> tuple[int, int]:
    """Where the page's (0, 0) is on screen, measured with one left_click of the dialect."""
    page.clear()
    claude(client, session, {"action": "left_click", "coordinate": [640, 700]})
    click = page.wait_for("click")[0]
    page.clear()
    return click["screenX"] - click["clientX"], click["screenY"] - click["clientY"]


@pytest.fixture
def at(origin: tuple[int, int]) -> Any:
    """Page coordinates → screen coordinates."""

    def to_screen(x: int, y: int) -> list[int]:
        return [origin[0] + x, origin[1] + y]

    return to_screen


@pytest.fixture
def field(client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any) -> None:
    """The text field, focused and empty; the event log cleared."""
    claude(client, session, {"action": "left_click", "coordinate": at(900, 175)})
    claude(client, session, {"action": "key", "text": "ctrl+a BackSpace"})
    assert page.wait_value("") == ""
    page.clear()


# -- Anthropic: computer_20250124 / computer_20251124 --------------------------------------


def test_anthropic_screenshot(client: httpx.Client, session: dict[str, Any], at: Any) -> None:
    image = block_image(claude(client, session, {"action": "screenshot"}))
    assert image.getpixel(tuple(at(200, 150))) == RED
    assert image.getpixel(tuple(at(500, 150))) == GREEN
    assert image.getpixel(tuple(at(200, 350))) == BLUE


@pytest.mark.parametrize(
    ("action", "button", "count", "spot"),
    [
        ("left_click", 0, 1, (450, 350)),
        ("right_click", 2, 1, (550, 380)),
        ("middle_click", 1, 1, (650, 410)),
        ("double_click", 0, 2, (750, 440)),
        ("triple_click", 0, 3, (850, 470)),
    ],
)
def test_anthropic_clicks(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any,
    action: str, button: int, count: int, spot: tuple[int, int],
) -> None:
    page.clear()
    blocks = claude(client, session, {"action": action, "coordinate": at(*spot)})
    ups = page.wait_for("mouseup", count=count)
    downs = page.events("mousedown")
    assert [(client_xy(e), e["button"]) for e in downs] == [(spot, button)] * count
    assert [(client_xy(e), e["button"]) for e in ups] == [(spot, button)] * count
    if button == 0:
        clicks = page.wait_for("click", count=count)
        assert [c["detail"] for c in clicks] == list(range(1, count + 1))
        if count > 1:
            assert len(page.wait_for("dblclick")) == 1
    if button == 2:
        assert page.wait_for("contextmenu")
    assert not any(held(e) for e in downs)
    # The answer shows the screen after the click.
    assert block_image(blocks).getpixel(tuple(at(500, 150))) == GREEN


@pytest.mark.parametrize(
    ("tool_input", "flags"),
    [
        ({"action": "left_click", "text": "shift"}, {"shift"}),
        ({"action": "left_click", "text": "ctrl+shift"}, {"ctrl", "shift"}),
        ({"action": "right_click", "text": "alt"}, {"alt"}),
        ({"action": "double_click", "text": "ctrl"}, {"ctrl"}),
    ],
)
def test_anthropic_clicks_hold_modifier_keys(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any,
    tool_input: dict[str, Any], flags: set[str],
) -> None:
    page.clear()
    claude(client, session, {**tool_input, "coordinate": at(480, 520)})
    down = page.wait_for("mousedown")[0]
    assert client_xy(down) == (480, 520)
    assert held(down) == flags
    # Released afterwards: the next click holds nothing.
    page.clear()
    time.sleep(0.6)  # not a multi-click with the one before
    claude(client, session, {"action": "left_click", "coordinate": at(480, 520)})
    assert held(page.wait_for("mousedown")[0]) == set()


def test_anthropic_click_without_coordinate_clicks_where_the_pointer_is(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    claude(client, session, {"action": "mouse_move", "coordinate": at(610, 530)})
    page.clear()
    claude(client, session, {"action": "left_click"})
    assert client_xy(page.wait_for("click")[0]) == (610, 530)


def test_anthropic_mouse_move_and_cursor_position(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    blocks = claude(client, session, {"action": "mouse_move", "coordinate": at(811, 333)})
    block_image(blocks)
    assert client_xy(page.wait_for("mousemove")[-1]) == (811, 333)
    x, y = at(811, 333)
    assert claude(client, session, {"action": "cursor_position"}) == [
        {"type": "text", "text": f"X={x},Y={y}"}
    ]


def test_anthropic_left_click_drag(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    blocks = claude(client, session, {
        "action": "left_click_drag", "start_coordinate": at(450, 320), "coordinate": at(900, 560),
    })
    block_image(blocks)
    up = page.wait_for("mouseup")[0]
    down = page.events("mousedown")[0]
    assert (client_xy(down), down["button"]) == ((450, 320), 0)
    assert (client_xy(up), up["button"]) == ((900, 560), 0)
    pressed = [client_xy(e) for e in page.events("mousemove") if e["buttons"] == 1]
    assert pressed[-1] == (900, 560)


def test_anthropic_left_mouse_down_and_up(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    # With coordinates (computer_20251124 style) ...
    page.clear()
    block_image(claude(client, session, {"action": "left_mouse_down", "coordinate": at(500, 400)}))
    block_image(claude(client, session, {"action": "left_mouse_up", "coordinate": at(540, 420)}))
    up = page.wait_for("mouseup")[0]
    assert client_xy(page.events("mousedown")[0]) == (500, 400)
    assert (client_xy(up), up["button"]) == ((540, 420), 0)
    # ... and without, after a mouse_move (computer_20250124 reference style).
    page.clear()
    claude(client, session, {"action": "mouse_move", "coordinate": at(700, 500)})
    claude(client, session, {"action": "left_mouse_down"})
    claude(client, session, {"action": "mouse_move", "coordinate": at(760, 520)})
    claude(client, session, {"action": "left_mouse_up"})
    up = page.wait_for("mouseup")[0]
    assert client_xy(page.events("mousedown")[0]) == (700, 500)
    assert client_xy(up) == (760, 520)


def wheel_total(page: EventPage) -> tuple[int, int]:
    wheels = page.events("wheel")
    return sum(w["deltaX"] for w in wheels), sum(w["deltaY"] for w in wheels)


def wait_wheel_total(page: EventPage, expected: tuple[int, int]) -> tuple[int, int]:
    deadline = time.monotonic() + 5
    while (total := wheel_total(page)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return total


@pytest.mark.parametrize(
    ("direction", "amount", "expected"),
    [("down", 3, (0, 3)), ("up", 2, (0, -2)), ("right", 2, (2, 0)), ("left", 1, (-1, 0))],
)
def test_anthropic_scroll(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any,
    direction: str, amount: int, expected: tuple[int, int],
) -> None:
    page.clear()
    blocks = claude(client, session, {
        "action": "scroll", "coordinate": at(700, 450),
        "scroll_direction": direction, "scroll_amount": amount,
    })
    block_image(blocks)
    px = (expected[0] * PX_PER_NOTCH, expected[1] * PX_PER_NOTCH)
    assert wait_wheel_total(page, px) == px
    assert all(client_xy(w) == (700, 450) and not held(w) for w in page.events("wheel"))


def test_anthropic_scroll_holds_modifier_keys(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    claude(client, session, {
        "action": "scroll", "coordinate": at(700, 450), "scroll_direction": "down",
        "scroll_amount": 1, "text": "ctrl",
    })
    wheel = page.wait_for("wheel")[0]
    assert held(wheel) == {"ctrl"}


def test_anthropic_type(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    text = "Hello, Claude! wörld ✓\nline two"
    block_image(claude(client, session, {"action": "type", "text": text}))
    assert page.wait_value(text) == text


def test_anthropic_key(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    claude(client, session, {"action": "type", "text": "abc"})
    assert page.wait_value("abc") == "abc"
    page.clear()
    block_image(claude(client, session, {"action": "key", "text": "ctrl+a"}))
    a_down = [e for e in page.wait_for("keydown", count=2) if e["key"] == "a"]
    assert len(a_down) == 1 and held(a_down[0]) == {"ctrl"}
    # xdotool style: several combos separated by spaces, pressed in turn.
    claude(client, session, {"action": "key", "text": "BackSpace"})
    assert page.wait_value("") == ""
    claude(client, session, {"action": "type", "text": "x"})
    claude(client, session, {"action": "key", "text": "Return Left Left"})
    claude(client, session, {"action": "type", "text": "y"})
    assert page.wait_value("yx\n") == "yx\n"


def test_anthropic_hold_key(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    block_image(claude(client, session, {"action": "hold_key", "text": "shift", "duration": 0.3}))
    up = page.wait_for("keyup")[0]
    down = page.events("keydown")[0]
    assert down["key"] == up["key"] == "Shift"
    assert up["t"] - down["t"] >= 280


def test_anthropic_wait(client: httpx.Client, session: dict[str, Any]) -> None:
    started = time.monotonic()
    block_image(claude(client, session, {"action": "wait", "duration": 0.4}))
    assert time.monotonic() - started >= 0.4


def test_anthropic_zoom(client: httpx.Client, session: dict[str, Any], at: Any) -> None:
    x1, y1 = at(250, 150)
    x2, y2 = at(450, 180)
    image = block_image(
        claude(client, session, {"action": "zoom", "region": [x1, y1, x2, y2]}), (200, 30)
    )
    assert image.getpixel((10, 10)) == RED
    assert image.getpixel((100, 10)) == (255, 255, 255)
    assert image.getpixel((190, 10)) == GREEN


def test_anthropic_coordinate_space_and_format(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    """A model told of a 640x400 display: its coordinates and images are in that space."""
    page.clear()
    x, y = at(700, 450)
    response = client.post(
        f"/v1/sessions/{session['id']}/actions/anthropic",
        json={"action": "left_click", "coordinate": [x // 2, y // 2]},
        params={"coordinate_space": "640x400", "format": "jpeg", "quality": 80},
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-deskbox-settled"] in ("true", "false")
    source = response.json()[0]["source"]
    assert source["media_type"] == "image/jpeg"
    image = decode(base64.b64decode(source["data"]))
    assert image.size == (640, 400)
    assert near(image.getpixel((at(200, 150)[0] // 2, at(200, 150)[1] // 2)), RED)
    click = page.wait_for("click")[0]
    assert abs(click["clientX"] - 700) <= 1 and abs(click["clientY"] - 450) <= 1
    assert claude(client, session, {"action": "cursor_position"},
                  coordinate_space="640x400") == [
        {"type": "text", "text": f"X={x // 2},Y={y // 2}"}
    ]


@pytest.mark.parametrize(
    ("tool_input", "words"),
    [
        ({"action": "teleport", "coordinate": [1, 1]}, "teleport"),
        ({"coordinate": [1, 1]}, "action"),
        ({"action": "mouse_move"}, "coordinate"),
        ({"action": "mouse_move", "coordinate": [1]}, "coordinate"),
        ({"action": "left_click", "coordinate": [-1, 5]}, "coordinate"),
        ({"action": "left_click", "coordinate": [5000, 5]}, "outside the 1280x800 screen"),
        ({"action": "left_click", "coordinate": [5, 5], "text": "hyper_shift"}, "unknown key"),
        ({"action": "left_click_drag", "coordinate": [5, 5]}, "start_coordinate"),
        ({"action": "scroll", "scroll_direction": "sideways", "scroll_amount": 1},
         "scroll_direction"),
        ({"action": "scroll", "scroll_direction": "down"}, "scroll_amount"),
        ({"action": "type"}, "text"),
        ({"action": "key", "text": "ctrl+nokey"}, "unknown key name"),
        ({"action": "key", "text": "   "}, "empty key"),
        ({"action": "hold_key", "text": "shift", "duration": 100}, "duration"),
        ({"action": "hold_key", "duration": 1}, "text"),
        ({"action": "wait", "duration": -1}, "duration"),
        ({"action": "zoom", "region": [10, 10, 5, 20]}, "region"),
        ({"action": "zoom", "region": [0, 0, 2000, 10]}, "outside"),
        ({"action": "zoom"}, "region"),
    ],
)
def test_anthropic_bad_input_is_422(
    client: httpx.Client, session: dict[str, Any], tool_input: dict[str, Any], words: str
) -> None:
    response = client.post(f"/v1/sessions/{session['id']}/actions/anthropic", json=tool_input)
    error = assert_error(response, 422, "invalid_request")
    assert words in error["message"]


def test_anthropic_bad_key_acts_not_at_all(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    """A bad combo anywhere in a key sequence is refused before the first combo runs."""
    response = client.post(f"/v1/sessions/{session['id']}/actions/anthropic",
                           json={"action": "key", "text": "a b nokey"})
    assert_error(response, 422, "invalid_request")
    time.sleep(0.2)
    assert page.events("keydown") == [] and page.field_value() == ""


def test_anthropic_bad_options_are_422(client: httpx.Client, session: dict[str, Any]) -> None:
    url = f"/v1/sessions/{session['id']}/actions/anthropic"
    for params in ({"coordinate_space": "640by400"}, {"format": "gif"}, {"quality": 0}):
        response = client.post(url, json={"action": "screenshot"}, params=params)
        assert_error(response, 422, "invalid_request")
    assert_error(client.post("/v1/sessions/nope/actions/anthropic",
                             json={"action": "screenshot"}), 404, "not_found")


# -- OpenAI: computer_call → computer_call_output -------------------------------------------


def test_openai_screenshot(client: httpx.Client, session: dict[str, Any], at: Any) -> None:
    image = output_image(gpt(client, session, {"type": "screenshot"}))
    assert image.getpixel(tuple(at(200, 150))) == RED
    assert image.getpixel(tuple(at(200, 350))) == BLUE


@pytest.mark.parametrize(
    ("button", "dom_button", "spot"),
    [("left", 0, (450, 350)), ("right", 2, (550, 380)), ("wheel", 1, (650, 410)),
     ("back", 3, (750, 440)), ("forward", 4, (850, 470))],
)
def test_openai_click_buttons(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any,
    button: str, dom_button: int, spot: tuple[int, int],
) -> None:
    page.clear()
    x, y = at(*spot)
    output = gpt(client, session, {
        "call_id": f"call_{button}",
        "action": {"type": "click", "button": button, "x": x, "y": y},
    })
    output_image(output, call_id=f"call_{button}")
    up = page.wait_for("mouseup")[0]
    down = page.events("mousedown")[0]
    assert (client_xy(down), down["button"]) == (spot, dom_button)
    assert (client_xy(up), up["button"]) == (spot, dom_button)
    if button == "left":
        assert page.wait_for("click")[0]["detail"] == 1


def test_openai_click_holds_keys(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    x, y = at(480, 560)
    gpt(client, session, {"type": "click", "button": "left", "x": x, "y": y,
                          "keys": ["CTRL", "SHIFT"]})
    assert held(page.wait_for("mousedown")[0]) == {"ctrl", "shift"}


def test_openai_double_click(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    x, y = at(920, 380)
    output_image(gpt(client, session, {"type": "double_click", "x": x, "y": y}))
    clicks = page.wait_for("click", count=2)
    assert [(client_xy(c), c["detail"]) for c in clicks] == [((920, 380), 1), ((920, 380), 2)]
    assert len(page.wait_for("dblclick")) == 1


@pytest.mark.parametrize(
    ("scroll_x", "scroll_y", "notches"),
    [(0, 250, (0, 3)), (0, -100, (0, -1)), (40, 0, (1, 0)), (-250, 0, (-3, 0)),
     (120, 300, (2, 3))],
)
def test_openai_scroll_pixels_become_notches(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any,
    scroll_x: int, scroll_y: int, notches: tuple[int, int],
) -> None:
    page.clear()
    x, y = at(700, 450)
    output_image(gpt(client, session, {
        "type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y,
    }))
    px = (notches[0] * PX_PER_NOTCH, notches[1] * PX_PER_NOTCH)
    assert wait_wheel_total(page, px) == px
    assert all(client_xy(w) == (700, 450) for w in page.events("wheel"))


def test_openai_scroll_distances_are_in_the_coordinate_space(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    """A model told of a 640x400 display scrolls by its own pixels: 100 of them are 200 of
    the 1280x800 screen, 2 notches (and -150 are -300, 3 notches left)."""
    page.clear()
    x, y = at(700, 450)
    output = gpt(client, session, {
        "type": "scroll", "x": x // 2, "y": y // 2, "scroll_x": -150, "scroll_y": 100,
    }, coordinate_space="640x400")
    assert output["output"]["type"] == "computer_screenshot"
    px = (-3 * PX_PER_NOTCH, 2 * PX_PER_NOTCH)
    assert wait_wheel_total(page, px) == px


def test_openai_scroll_holds_keys(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    x, y = at(700, 450)
    gpt(client, session, {"type": "scroll", "x": x, "y": y, "scroll_x": 0, "scroll_y": 100,
                          "keys": ["CTRL"]})
    assert held(page.wait_for("wheel")[0]) == {"ctrl"}


def test_openai_type(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    text = "Hello, GPT! 0123 ~!@#$%^&*() — ✓ 日本"
    output_image(gpt(client, session, {"type": "type", "text": text}))
    assert page.wait_value(text) == text


def test_openai_keypress_upper_case_names(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    def press(*keys: str) -> None:
        output_image(gpt(client, session, {"type": "keypress", "keys": list(keys)}))

    gpt(client, session, {"type": "type", "text": "ab"})
    assert page.wait_value("ab") == "ab"
    press("ARROWLEFT")
    press("SPACE")
    assert page.wait_value("a b") == "a b"
    press("END")
    press("ENTER")
    assert page.wait_value("a b\n") == "a b\n"
    page.clear()
    press("CTRL", "A")  # ctrl+a, not ctrl+shift+a
    a_down = [e for e in page.wait_for("keydown", count=2) if e["code"] == "KeyA"]
    assert len(a_down) == 1 and held(a_down[0]) == {"ctrl"} and a_down[0]["key"] == "a"
    press("BACKSPACE")
    assert page.wait_value("") == ""
    press("SHIFT", "A")
    press("A")
    press("/")
    assert page.wait_value("Aa/") == "Aa/"
    press("HOME")
    press("DELETE")
    press("ESC")
    assert page.wait_value("a/") == "a/"


def test_openai_wait(client: httpx.Client, session: dict[str, Any]) -> None:
    started = time.monotonic()
    output_image(gpt(client, session, {"call_id": "call_w", "action": {"type": "wait"}}),
                 call_id="call_w")
    assert time.monotonic() - started >= 1.0


def test_openai_waits_add_up_to_a_batchs_bound(
    client: httpx.Client, session: dict[str, Any],
) -> None:
    """61 waits of 1 s were taken (up to 100 s), past the 60 s every other batch keeps to."""
    over = client.post(f"/v1/sessions/{session['id']}/actions/openai", json={
        "call_id": "call_w", "actions": [{"type": "wait"}] * 61})
    assert "may add up to 60 s at most" in assert_error(over, 422, "invalid_request")["message"]


def test_openai_move(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    x, y = at(777, 444)
    output_image(gpt(client, session, {"type": "move", "x": x, "y": y}))
    assert client_xy(page.wait_for("mousemove")[-1]) == (777, 444)


def test_openai_drag(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    page.clear()
    spots = [(450 + 60 * i, 330 + 25 * i) for i in range(5)]
    path = [dict(zip(("x", "y"), at(*spot), strict=True)) for spot in spots]
    output_image(gpt(client, session, {"type": "drag", "path": path}))
    up = page.wait_for("mouseup")[0]
    down = page.events("mousedown")[0]
    assert (client_xy(down), down["button"]) == (spots[0], 0)
    assert (client_xy(up), up["button"]) == (spots[-1], 0)
    pressed = [client_xy(e) for e in page.events("mousemove") if e["buttons"] == 1]
    assert pressed == spots[1:]


def test_openai_drag_and_move_hold_keys(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    """``keys`` of a drag or a move (OpenAI's schema has them: a shift-drag extends a
    selection, a ctrl-drag copies) are held from the press to the release, then let go."""
    page.clear()
    spots = [(450, 330), (600, 380), (750, 430)]
    path = [dict(zip(("x", "y"), at(*spot), strict=True)) for spot in spots]
    output_image(gpt(client, session, {"type": "drag", "path": path, "keys": ["SHIFT"]}))
    up = page.wait_for("mouseup")[0]
    down = page.events("mousedown")[0]
    pressed = [e for e in page.events("mousemove") if e["buttons"] == 1]
    assert (client_xy(down), held(down)) == (spots[0], {"shift"})
    assert [(client_xy(e), held(e)) for e in pressed] == [(s, {"shift"}) for s in spots[1:]]
    assert (client_xy(up), held(up)) == (spots[-1], {"shift"})
    page.clear()
    x, y = at(777, 444)
    output_image(gpt(client, session, {"type": "move", "x": x, "y": y, "keys": ["CTRL"]}))
    move = page.wait_for("mousemove")[-1]
    assert (client_xy(move), held(move)) == ((777, 444), {"ctrl"})
    page.clear()
    x, y = at(700, 500)
    gpt(client, session, {"type": "move", "x": x, "y": y})
    assert held(page.wait_for("mousemove")[-1]) == set()


def test_openai_whole_computer_call_and_batched_actions(
    client: httpx.Client, session: dict[str, Any], page: EventPage, at: Any
) -> None:
    x, y = at(900, 175)
    item = {
        "type": "computer_call",
        "id": "cu_0123",
        "call_id": "call_abc",
        "status": "completed",
        "pending_safety_checks": [],
        "actions": [
            {"type": "click", "button": "left", "x": x, "y": y},
            {"type": "keypress", "keys": ["CTRL", "A"]},
            {"type": "keypress", "keys": ["BACKSPACE"]},
            {"type": "type", "text": "batched"},
            {"type": "screenshot"},
        ],
    }
    output_image(gpt(client, session, item), call_id="call_abc")
    assert page.wait_value("batched") == "batched"
    single = {**item, "action": {"type": "type", "text": "!"}}
    del single["actions"]
    output_image(gpt(client, session, single, format="webp"), call_id="call_abc",
                 media_type="image/webp")
    assert page.wait_value("batched!") == "batched!"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"type": "teleport", "x": 1, "y": 1}, "teleport"),
        ({"x": 1, "y": 1}, "type"),
        ({"type": "click", "button": "left", "y": 1}, "x"),
        ({"type": "click", "button": "thumb", "x": 1, "y": 1}, "button"),
        ({"type": "click", "x": 5000, "y": 1}, "outside the 1280x800 screen"),
        ({"type": "click", "x": 1, "y": 1, "keys": ["HYPERSHIFT"]}, "unknown key"),
        ({"type": "keypress", "keys": ["CTRL", "NOKEY"]}, "unknown key name"),
        ({"type": "keypress", "keys": []}, "keys"),
        ({"type": "scroll", "x": 1, "y": 1, "scroll_y": 10**9}, "scroll_y"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}]}, "path"),
        ({"type": "move", "x": 1, "y": 1, "keys": ["HYPERSHIFT"]}, "unknown key"),
        ({"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 2, "y": 2}], "keys": ["NOKEY"]},
         "unknown key"),
        ({"type": "type"}, "text"),
        ({"call_id": "c", "action": {"type": "wait"}, "actions": [{"type": "wait"}]},
         "either action or actions"),
        ({"call_id": "c", "actions": []}, "actions"),
        ({"call_id": "c"}, "either action or actions"),
    ],
)
def test_openai_bad_input_is_422(
    client: httpx.Client, session: dict[str, Any], body: dict[str, Any], words: str
) -> None:
    response = client.post(f"/v1/sessions/{session['id']}/actions/openai", json=body)
    error = assert_error(response, 422, "invalid_request")
    assert words in error["message"]


def test_openai_bad_key_in_a_batch_acts_not_at_all(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None
) -> None:
    response = client.post(f"/v1/sessions/{session['id']}/actions/openai", json={
        "actions": [{"type": "type", "text": "zz"}, {"type": "keypress", "keys": ["NOKEY"]}],
    })
    assert_error(response, 422, "invalid_request")
    time.sleep(0.2)
    assert page.field_value() == ""


@pytest.mark.parametrize(
    ("params", "point"),
    [({}, (5000, 10)), ({"coordinate_space": "640x400"}, (700, 10))],
)
def test_openai_point_off_screen_in_a_batch_acts_not_at_all(
    client: httpx.Client, session: dict[str, Any], page: EventPage, field: None,
    params: dict[str, str], point: tuple[int, int],
) -> None:
    """A batch whose later action points off the screen (of the model's space) is refused
    before its first action runs: a model that retries the call types its text once."""
    x, y = point
    response = client.post(f"/v1/sessions/{session['id']}/actions/openai", params=params, json={
        "actions": [{"type": "type", "text": "zz"}, {"type": "keypress", "keys": ["ENTER"]},
                    {"type": "click", "button": "left", "x": x, "y": y}],
    })
    error = assert_error(response, 422, "invalid_request")
    assert f"point ({x}, {y}) is outside the" in error["message"]
    time.sleep(0.2)
    assert page.events("keydown") == [] and page.field_value() == ""


# -- translation alone (no desktop) ------------------------------------------------------


def test_openai_pixels_to_notches_round_away_from_zero() -> None:
    from deskbox_server.dialects.openai import notches

    assert [notches(px) for px in (0, 1, 99, 100, 101, 250, -1, -100, -101)] == [
        0, 1, 1, 1, 2, 3, -1, -1, -2,
    ]


def test_openai_key_names() -> None:
    from deskbox_server.dialects.openai import key_name

    assert [key_name(k) for k in ("CTRL", "A", "z", "+", " ", "ARROWLEFT", "F5", "/")] == [
        "CTRL", "a", "z", "plus", "space", "ARROWLEFT", "F5", "/",
    ]
