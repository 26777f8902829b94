"""Actions through REST land in the page exactly; screenshots show its known colours."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from .conftest import EventPage
from .helpers import decode, near

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def act(client: httpx.Client, session: dict[str, Any], body: dict[str, Any]) -> Any:
    response = client.post(f"/v1/sessions/{session['id']}/actions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def origin(client: httpx.Client, session: dict[str, Any], page: EventPage) -> tuple[int, int]:
    """Where the page's (0, 0) is on screen, measured with one click through the API."""
    page.clear()
    act(client, session, {"type": "click", "x": 640, "y": 700})
    click = page.wait_for("click")[0]
    page.clear()
    return click["screenX"] - click["clientX"], click["screenY"] - click["clientY"]


def test_click_lands_exactly(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    page.clear()
    x, y = origin[0] + 150, origin[1] + 150
    assert act(client, session, {"type": "click", "x": x, "y": y}) == {
        "results": [{}], "settled": True,
    }
    events = page.wait_for("mousedown", "mouseup", "click", count=3)
    assert [e["type"] for e in events] == ["mousedown", "mouseup", "click"]
    assert all((e["clientX"], e["clientY"], e["button"]) == (150, 150, 0) for e in events)


@pytest.mark.parametrize(
    "text",
    [
        "Hello, World! 0123456789 ~!@#$%^&*()",
        "Hello, wörld — ✓ 日本",
    ],
)
def test_typed_text_lands_in_the_field(
    client: httpx.Client,
    session: dict[str, Any],
    page: EventPage,
    origin: tuple[int, int],
    text: str,
) -> None:
    field = {"type": "click", "x": origin[0] + 900, "y": origin[1] + 175}
    act(client, session, {"actions": [field, {"type": "key", "keys": "ctrl+a"},
                                      {"type": "key", "keys": "BackSpace"},
                                      {"type": "type", "text": text}]})
    assert page.wait_value(text) == text
    act(client, session, {"actions": [{"type": "key", "keys": "ctrl+a"},
                                      {"type": "type", "text": "x"}]})
    assert page.wait_value("x") == "x"


def test_screenshot_shows_the_page_colours(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    response = client.get(f"/v1/sessions/{session['id']}/screenshot", params={"format": "png"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/png"
    image = decode(response.content)
    assert image.size == (1280, 800)
    assert image.getpixel((ox + 200, oy + 150)) == RED
    assert image.getpixel((ox + 500, oy + 150)) == GREEN
    assert image.getpixel((ox + 200, oy + 350)) == BLUE

    response = client.get(
        f"/v1/sessions/{session['id']}/screenshot",
        params={"format": "jpeg", "quality": 80, "scale": "640x400"},
    )
    assert response.headers["content-type"] == "image/jpeg"
    small = decode(response.content)
    assert small.size == (640, 400)
    assert near(small.getpixel(((ox + 200) // 2, (oy + 150) // 2)), RED)
    assert near(small.getpixel(((ox + 200) // 2, (oy + 350) // 2)), BLUE)


def test_batch_with_settled_screenshot(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    body = act(client, session, {
        "actions": [{"type": "move", "x": ox + 450, "y": oy + 450},
                    {"type": "cursor_position"}, {"type": "screen_size"}],
        "screenshot": {"format": "png"},
    })
    assert body["results"] == [{}, {"x": ox + 450, "y": oy + 450},
                               {"width": 1280, "height": 800}]
    shot = body["screenshot"]
    assert (shot["media_type"], shot["width"], shot["height"]) == ("image/png", 1280, 800)
    image = decode(base64.b64decode(shot["data_b64"]))
    assert image.getpixel((ox + 500, oy + 150)) == GREEN

    # A screenshot action in the batch answers with an image result.
    body = act(client, session, {"type": "screenshot", "format": "jpeg",
                                 "region": {"x": ox + 100, "y": oy + 100,
                                            "width": 200, "height": 100}})
    region = body["results"][0]
    assert (region["width"], region["height"]) == (200, 100)
    assert near(decode(base64.b64decode(region["data_b64"])).getpixel((100, 50)), RED)


def test_coordinate_space(
    client: httpx.Client, session: dict[str, Any], page: EventPage, origin: tuple[int, int]
) -> None:
    """Coordinates and screenshots in a 640x400 space map onto the 1280x800 screen."""
    ox, oy = origin
    page.clear()
    view = {"width": 640, "height": 400}
    body = act(client, session, {
        "actions": [{"type": "click", "x": (ox + 200) // 2, "y": (oy + 150) // 2},
                    {"type": "cursor_position"}, {"type": "screen_size"}],
        "coordinate_space": view,
        "screenshot": {"format": "png"},
    })
    assert body["results"][1] == {"x": (ox + 200) // 2, "y": (oy + 150) // 2}
    assert body["results"][2] == view
    assert (body["screenshot"]["width"], body["screenshot"]["height"]) == (640, 400)
    click = page.wait_for("click")[0]
    assert abs(click["clientX"] - 200) <= 1 and abs(click["clientY"] - 150) <= 1
