"""The handoff's API without a browser (test_vnc.py drives the real page): who may take
control, the lease, the agent's long poll, bad input. The local backend: fast, real HTTP."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from ..rfb_client import RfbViewer
from .conftest import DISPLAY, Server
from .helpers import access_statuses, assert_error, server_log, token_for

CLICK = {"type": "click", "x": 10, "y": 10}


@pytest.fixture
def desk(client: httpx.Client) -> Iterator[dict[str, Any]]:
    response = client.post("/v1/sessions", json={"display": DISPLAY})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    yield session
    client.delete(f"/v1/sessions/{session['id']}")


def test_only_a_control_link_or_the_owner_takes_control(
    client: httpx.Client, desk: dict[str, Any], server: Server
) -> None:
    sid = desk["id"]
    control = f"{server.url}/v1/sessions/{sid}/control"
    assert_error(httpx.post(control, params={"token": token_for(client, sid, "view")}),
                 403, "forbidden")
    assert_error(httpx.post(control), 401, "unauthorized")
    taken = httpx.post(control, params={"token": token_for(client, sid, "control")})
    assert taken.status_code == 200 and taken.json()["human_in_control"] is True, taken.text
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json=CLICK), 409,
                 "human_in_control")
    # Looking goes on; so do the dialects' screenshots.
    assert client.get(f"/v1/sessions/{sid}/screenshot").status_code == 200
    assert client.post(f"/v1/sessions/{sid}/actions/anthropic",
                       json={"action": "screenshot"}).status_code == 200
    assert_error(client.post(f"/v1/sessions/{sid}/actions/anthropic",
                             json={"action": "left_click", "coordinate": [5, 5]}),
                 409, "human_in_control")
    back = client.delete(f"/v1/sessions/{sid}/control")  # the owner's key may hand back
    assert back.status_code == 200 and back.json()["human_in_control"] is False
    assert client.delete(f"/v1/sessions/{sid}/control").status_code == 200  # idempotent
    assert client.post(f"/v1/sessions/{sid}/actions", json=CLICK).status_code == 200


def test_a_second_person_cannot_take_control_from_the_first(
    client: httpx.Client, desk: dict[str, Any], server: Server
) -> None:
    """Two people with control links press "Take control" (the second before its page's
    status poll hid the button): both were answered 200, and both pages said "you are in
    control" and offered "Hand back". The second is refused while the first holds it; the
    holder renews its lease; after the hand-back the other may take it."""
    sid = desk["id"]
    control = f"{server.url}/v1/sessions/{sid}/control"
    first, second = (token_for(client, sid, "control") for _ in range(2))
    taken = httpx.post(control, params={"token": first}, json={"lease_s": 60})
    assert taken.status_code == 200, taken.text
    assert_error(httpx.post(control, params={"token": second}), 409, "human_in_control")
    assert_error(client.post(control), 409, "human_in_control")  # the owner's key as well
    renewed = httpx.post(control, params={"token": first}, json={"lease_s": 120})
    assert renewed.status_code == 200, renewed.text
    assert renewed.json()["since"] == taken.json()["since"]
    assert renewed.json()["until"] > taken.json()["until"]
    assert httpx.delete(control, params={"token": first}).status_code == 200
    again = httpx.post(control, params={"token": second})
    assert again.status_code == 200 and again.json()["human_in_control"] is True, again.text
    assert client.delete(control).status_code == 200


def test_the_lease_runs_out(client: httpx.Client, desk: dict[str, Any]) -> None:
    sid = desk["id"]
    taken = client.post(f"/v1/sessions/{sid}/control", json={"lease_s": 1})
    assert taken.status_code == 200, taken.text
    assert_error(client.post(f"/v1/sessions/{sid}/actions", json=CLICK), 409,
                 "human_in_control")
    time.sleep(1.3)
    state = client.get(f"/v1/sessions/{sid}/handoff").json()
    assert state["human_in_control"] is False and state["handed_back_at"], state
    assert client.post(f"/v1/sessions/{sid}/actions", json=CLICK).status_code == 200
    with client.stream("GET", f"/v1/sessions/{sid}/events", timeout=5) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and "human_handed_back" in line:
                assert "the lease ran out" in line
                break


def test_an_agent_that_waits_is_answered_at_its_timeout(
    client: httpx.Client, desk: dict[str, Any]
) -> None:
    sid = desk["id"]
    started = time.monotonic()
    waited = client.post(f"/v1/sessions/{sid}/handoff", params={"wait": "true",
                         "timeout_s": "0.5"}, json={"reason": "a login form"})
    assert waited.status_code == 200, waited.text
    assert 0.4 < time.monotonic() - started < 5
    body = waited.json()
    assert (body["needs_help"], body["reason"], body["human_in_control"]) == (
        True, "a login form", False)


def test_a_wait_ends_when_its_client_leaves(
    client: httpx.Client, desk: dict[str, Any], server: Server
) -> None:
    """An agent that stops waiting (its timeout closes its connection): the server ends
    the wait then, not at ``timeout_s`` (it stayed parked up to 10 minutes), and logs no
    error for it."""
    sid = desk["id"]
    path = f"/v1/sessions/{sid}/handoff"
    with server_log() as records, server.client() as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post(path, params={"wait": "true", "timeout_s": "60"},
                      json={"reason": "a captcha"}, timeout=0.5)
        deadline = time.monotonic() + 5
        while not access_statuses(records, "POST", path):
            assert time.monotonic() < deadline, "the wait goes on without its client"
            time.sleep(0.05)
    # 499: nginx's status for a client that left (no one reads the answer).
    assert access_statuses(records, "POST", path) == [499]
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    # The request for help stands: a human may still come.
    assert client.get(path).json()["needs_help"] is True


def test_the_hand_back_that_answers_a_request_for_help_clears_it(
    client: httpx.Client, desk: dict[str, Any], server: Server
) -> None:
    """An agent that asks for help while a human already drives the session (it waited
    on a 409) is answered by the hand-back: its wait ended, yet GET /handoff and the live
    view's status still said ``needs_help`` with its reason, a request nobody would
    answer again."""
    sid = desk["id"]
    control = token_for(client, sid, "control")
    assert httpx.post(f"{server.url}/v1/sessions/{sid}/control",
                      params={"token": control}).status_code == 200
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, f"/v1/sessions/{sid}/handoff",
                              params={"wait": "true", "timeout_s": "30"},
                              json={"reason": "a captcha"})
        deadline = time.monotonic() + 5
        while not client.get(f"/v1/sessions/{sid}/handoff").json()["needs_help"]:
            assert time.monotonic() < deadline, "the request for help did not arrive"
            time.sleep(0.05)
        back = httpx.delete(f"{server.url}/v1/sessions/{sid}/control",
                            params={"token": control})
        assert back.status_code == 200, back.text
        answered = waiting.result(timeout=10)
    assert answered.status_code == 200, answered.text
    for state in (answered.json(), back.json(),
                  client.get(f"/v1/sessions/{sid}/handoff").json(),
                  httpx.get(f"{server.url}/v1/sessions/{sid}/view/status",
                            params={"token": control}).json()):
        assert (state["needs_help"], state["reason"], state["human_in_control"]) == (
            False, None, False), state


def test_bad_handoff_input_is_a_clear_4xx(client: httpx.Client, desk: dict[str, Any]) -> None:
    sid = desk["id"]
    for bad in ({}, {"reason": ""}, {"reason": "x" * 1001}, {"reason": "x", "extra": 1}):
        assert_error(client.post(f"/v1/sessions/{sid}/handoff", json=bad), 422,
                     "invalid_request")
    assert_error(client.post(f"/v1/sessions/{sid}/handoff", params={"timeout_s": "601"},
                             json={"reason": "x"}), 422, "invalid_request")
    for bad_lease in ({"lease_s": 0}, {"lease_s": "5"}, {"lease_s": 86_401}):
        assert_error(client.post(f"/v1/sessions/{sid}/control", json=bad_lease), 422,
                     "invalid_request")
    assert_error(client.post("/v1/sessions/ses_nope/handoff", json={"reason": "x"}), 404,
                 "not_found")
    assert_error(client.post("/v1/sessions/ses_nope/control"), 404, "not_found")


@pytest.fixture
def short(client: httpx.Client) -> Iterator[dict[str, Any]]:
    """A session whose idle timeout is 2 s."""
    response = client.post("/v1/sessions", json={"display": DISPLAY, "timeout_s": 2})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    yield session
    client.delete(f"/v1/sessions/{session['id']}")


def state_of(client: httpx.Client, sid: str) -> str:
    return str(client.get(f"/v1/sessions/{sid}").json()["state"])


def stops_idle_within(client: httpx.Client, sid: str, low_s: float, high_s: float) -> None:
    """The reaper stops it between ``low_s`` and ``high_s`` from now, and not before."""
    started = time.monotonic()
    while state_of(client, sid) == "running":
        assert time.monotonic() - started < high_s, "the idle timeout did not stop it"
        time.sleep(0.1)
    assert time.monotonic() - started > low_s, "stopped before its idle time had passed"


def test_a_human_in_control_or_typing_in_the_live_view_keeps_the_idle_timeout_away(
    client: httpx.Client, short: dict[str, Any]
) -> None:
    """The reaper stopped a session under a human's control once its idle timeout passed
    (taking control, and a control viewer's input, touched nothing), closing the viewer."""
    sid = short["id"]
    assert client.post(f"/v1/sessions/{sid}/control", json={"lease_s": 60}).status_code == 200
    time.sleep(3.5)
    assert state_of(client, sid) == "running"
    assert client.delete(f"/v1/sessions/{sid}/control").status_code == 200
    time.sleep(1.0)  # the idle time counts from the hand-back
    with RfbViewer(f"{short['urls']['vnc_ws']}?token={token_for(client, sid, 'control')}") \
            as viewer:
        for _ in range(6):  # a human moving the mouse in the view, for 3 s
            viewer.pointer(100, 100, 0)
            time.sleep(0.5)
        assert state_of(client, sid) == "running"
    stops_idle_within(client, sid, 1.0, 8.0)


def test_an_agent_waiting_for_help_keeps_its_session_and_its_end_answers_409(
    client: httpx.Client, short: dict[str, Any]
) -> None:
    sid = short["id"]
    waited = client.post(f"/v1/sessions/{sid}/handoff", params={"wait": "true",
                         "timeout_s": "3.5"}, json={"reason": "a captcha"})
    assert waited.status_code == 200, waited.text
    assert state_of(client, sid) == "running"

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(client.post, f"/v1/sessions/{sid}/handoff",
                              params={"wait": "true", "timeout_s": "30"},
                              json={"reason": "a captcha"})
        time.sleep(0.5)
        assert client.delete(f"/v1/sessions/{sid}").status_code == 204
        # It was answered 200, as if its timeout had passed, with nobody having come.
        assert_error(waiting.result(timeout=10), 409, "conflict")
