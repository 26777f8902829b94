"""The Python SDK against a real server (local backend): sessions, actions, errors.

Every session a test creates is deleted by the test's own ``with`` block or finalizer.
"""

from __future__ import annotations

import asyncio
import inspect
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from websockets.sync.server import ServerConnection, serve

import deskbox
from deskbox import (
    APIConnectionError,
    APIError,
    AsyncDeskbox,
    Conflict,
    Deskbox,
    DeskboxError,
    Forbidden,
    NotFound,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    Session,
    Unauthorized,
    UnprocessableEntity,
)

from .conftest import KEY_A, Server

DISPLAY = {"width": 800, "height": 600}
PAGE = (
    "data:text/html,<body style='margin:0;background:rgb(0,0,255)'>"
    "<input id=f style='width:400px;height:40px'></body>"
)

# -- the two clients mirror each other --------------------------------------------------

PAIRS = [
    (deskbox.Deskbox, deskbox.AsyncDeskbox),
    (deskbox.Sessions, deskbox.AsyncSessions),
    (deskbox.Snapshots, deskbox.AsyncSnapshots),
    (deskbox.Session, deskbox.AsyncSession),
    (deskbox.ActionsSocket, deskbox.AsyncActionsSocket),
]
# Protocol methods that differ by nature: (a)enter/(a)exit.
CONTEXT = {"__enter__", "__exit__", "__aenter__", "__aexit__"}


def _public(cls: type) -> dict[str, Any]:
    return {
        name: member for name, member in inspect.getmembers(cls)
        if callable(member) and not name.startswith("_")
    }


def _normalized(sig: inspect.Signature) -> str:
    return str(sig).replace("Async", "").replace("httpx.BaseTransport", "Transport").replace(
        "httpx.AsyncBaseTransport", "Transport")


@pytest.mark.parametrize(("sync", "async_"), PAIRS, ids=lambda c: c.__name__)
def test_sync_and_async_expose_the_same_methods(sync: type, async_: type) -> None:
    sync_methods, async_methods = _public(sync), _public(async_)
    # AsyncActionsSocket has connect() (sync sockets connect when made): nothing else differs.
    assert set(sync_methods) == set(async_methods) - {"connect"}
    for name, method in sync_methods.items():
        assert _normalized(inspect.signature(method)) == _normalized(
            inspect.signature(async_methods[name])), name
    assert _normalized(inspect.signature(sync.__init__)) == _normalized(
        inspect.signature(async_.__init__))
    # Every I/O method of the async client is a coroutine function.
    for name in set(async_methods) - {"actions_ws"}:
        assert inspect.iscoroutinefunction(async_methods[name]), name
    collections = (deskbox.Sessions, deskbox.Snapshots)
    assert {"__enter__", "__exit__"} <= set(dir(sync)) or sync in collections
    async_collections = (deskbox.AsyncSessions, deskbox.AsyncSnapshots)
    assert {"__aenter__", "__aexit__"} <= set(dir(async_)) or async_ in async_collections


def test_every_error_is_a_deskbox_error() -> None:
    for name in deskbox.__all__:
        obj = getattr(deskbox, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, DeskboxError), name


def test_exported_names() -> None:
    assert {"Deskbox", "AsyncDeskbox", "Session", "DeskboxError", "APIError"} <= set(
        deskbox.__all__)
    assert all(hasattr(deskbox, name) for name in deskbox.__all__)


# -- configuration and error mapping without a server ------------------------------------


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DESKBOX_URL", "http://127.0.0.1:1/")
    monkeypatch.setenv("DESKBOX_API_KEY", "from-env")
    with Deskbox() as box:
        assert box.base_url == "http://127.0.0.1:1" and box.api_key == "from-env"
    with Deskbox("http://127.0.0.1:2", "from-arg") as box:
        assert box.base_url == "http://127.0.0.1:2" and box.api_key == "from-arg"
    monkeypatch.delenv("DESKBOX_URL")
    with Deskbox() as box:
        assert box.base_url == "http://127.0.0.1:8765"


def _answer(status: int, kind: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"error": {"type": kind, "message": "m", "request_id": "req_1"}}
    return httpx.Response(status, json=body, headers=headers)


def test_capacity_errors_carry_retry_after() -> None:
    answers = iter([_answer(429, "capacity", {"Retry-After": "3"}),
                    _answer(503, "capacity", {"Retry-After": "7"})])
    transport = httpx.MockTransport(lambda request: next(answers))
    with Deskbox("http://deskbox.test", "k", transport=transport) as box:
        with pytest.raises(RateLimited) as limited:
            box.sessions.create()
        assert limited.value.retry_after == 3.0 and limited.value.request_id == "req_1"
        with pytest.raises(ServiceUnavailable) as unavailable:
            box.sessions.list()
        assert unavailable.value.retry_after == 7.0 and unavailable.value.status == 503


def test_max_retries_sends_a_call_refused_for_capacity_again() -> None:
    """Only a refusal for capacity (429, 503: the server did nothing) is sent again, after
    its Retry-After, at most ``max_retries`` times; then the last refusal is raised."""
    sent: list[httpx.Request] = []

    def client(answers: list[httpx.Response], max_retries: int) -> Deskbox:
        queue = iter(answers)

        def answer(request: httpx.Request) -> httpx.Response:
            sent.append(request)
            return next(queue)
        return Deskbox("http://deskbox.test", "k", transport=httpx.MockTransport(answer),
                       max_retries=max_retries)

    now = {"Retry-After": "0"}
    with client([_answer(429, "capacity", now), _answer(503, "capacity", now),
                 httpx.Response(201, json={"id": "ses_1", "state": "running"})], 2) as box:
        assert box.sessions.create(wait=False).id == "ses_1"
    assert [request.method for request in sent] == ["POST"] * 3
    assert sent[0].content == sent[2].content  # the same call, body and all
    sent.clear()
    with client([_answer(429, "capacity", now)] * 2, 1) as box:
        with pytest.raises(RateLimited):
            box.sessions.list()
    assert len(sent) == 2
    sent.clear()
    with client([_answer(409, "conflict")], 3) as box:
        with pytest.raises(Conflict):
            box.sessions.list()
    assert len(sent) == 1
    sent.clear()
    with client([_answer(429, "quota_exceeded")], 3) as box:  # waiting frees no quota
        with pytest.raises(QuotaExceeded) as full:
            box.snapshots.list()
    assert len(sent) == 1 and isinstance(full.value, RateLimited)
    assert full.value.retry_after is None
    with pytest.raises(ValueError, match="max_retries"):
        Deskbox("http://deskbox.test", max_retries=-1)


def test_max_retries_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DESKBOX_MAX_RETRIES", "4")
    assert Deskbox("http://deskbox.test").max_retries == 4
    assert AsyncDeskbox("http://deskbox.test", max_retries=0).max_retries == 0
    monkeypatch.setenv("DESKBOX_MAX_RETRIES", "many")
    with pytest.raises(ValueError, match="DESKBOX_MAX_RETRIES"):
        Deskbox("http://deskbox.test")
    monkeypatch.delenv("DESKBOX_MAX_RETRIES")
    assert Deskbox("http://deskbox.test").max_retries == 0


def test_transport_failures_are_deskbox_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with Deskbox("http://deskbox.test", "k", transport=httpx.MockTransport(refuse)) as box:
        with pytest.raises(APIConnectionError):
            box.sessions.list()
    with Deskbox("http://deskbox.test", "k", transport=httpx.MockTransport(slow)) as box:
        with pytest.raises(deskbox.APITimeoutError):
            box.sessions.get("x", timeout=0.5)

    def silent(request: httpx.Request) -> httpx.Response:  # httpx's own carry no text
        raise httpx.ReadTimeout("", request=request)

    with Deskbox("http://deskbox.test", "k", transport=httpx.MockTransport(silent)) as box:
        with pytest.raises(deskbox.APITimeoutError) as raised:
            box.sessions.get("x", timeout=0.5)
    assert "no answer in time: ReadTimeout" in str(raised.value)


def _moved_proxy(request: httpx.Request) -> httpx.Response:
    """A reverse proxy in front of a moved API (httpx's MockTransport: a misbehaving server
    the real one is not): 308 for a delete, an HTML page, a body not in its encoding."""
    if request.method == "DELETE":
        return httpx.Response(308, headers={"Location": f"https://moved.test{request.url.path}"})
    if request.url.path == "/v1/sessions":
        return httpx.Response(200, text="<html>sign in</html>",
                              headers={"Content-Type": "text/html"})
    return httpx.Response(200, content=b"not gzip", headers={
        "Content-Encoding": "gzip", "Content-Type": "application/json"})


def test_answers_that_are_not_the_apis_are_errors() -> None:
    """A 3xx was read as success (a delete answered 308 returned None, nothing deleted); a
    body that is not JSON, or not in its encoding, raised json's or httpx's own errors."""
    with Deskbox("http://deskbox.test", "k", transport=httpx.MockTransport(_moved_proxy)) as box:
        with pytest.raises(APIError) as moved:
            box.sessions.delete("ses_abc")
        assert (moved.value.status, moved.value.type) == (308, "redirect")
        assert "https://moved.test/v1/sessions/ses_abc" in str(moved.value)
        with pytest.raises(APIError) as page:
            box.sessions.list()
        assert (page.value.status, page.value.type) == (200, "invalid_response")
        assert "text/html" in str(page.value)
        with pytest.raises(APIConnectionError, match="could not be decoded"):
            box.health()


async def test_async_answers_that_are_not_the_apis_are_errors() -> None:
    async with AsyncDeskbox("http://deskbox.test", "k",
                            transport=httpx.MockTransport(_moved_proxy)) as box:
        with pytest.raises(APIError, match="redirect"):
            await box.sessions.delete("ses_abc")
        with pytest.raises(APIError, match="not JSON"):
            await box.sessions.list()
        with pytest.raises(APIConnectionError, match="could not be decoded"):
            await box.health()


def test_requests_carry_the_key_and_the_per_call_timeout() -> None:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"sessions": []})

    with Deskbox("http://deskbox.test", "k1", transport=httpx.MockTransport(record)) as box:
        assert box.sessions.list(labels={"a": "b"}, state="running", timeout=3) == []
    assert seen[0].headers["authorization"] == "Bearer k1"
    assert seen[0].url.params.get_list("label") == ["a:b"]
    assert seen[0].extensions["timeout"]["read"] == 3


# -- against a real server ------------------------------------------------------------------


def test_max_retries_waits_for_a_session_to_free_up(one_per_key: Server) -> None:
    with Deskbox(one_per_key.url, KEY_A) as impatient, \
            Deskbox(one_per_key.url, KEY_A, max_retries=5) as patient:
        first = impatient.sessions.create(display=DISPLAY)
        with pytest.raises(RateLimited) as refused:
            impatient.sessions.create(display=DISPLAY)
        assert refused.value.retry_after == 1.0
        freeing = threading.Timer(0.5, first.close)
        freeing.start()
        started = time.monotonic()
        try:
            with patient.sessions.create(display=DISPLAY) as second:
                waited = time.monotonic() - started
                assert second.state == "running" and second.id != first.id
        finally:
            freeing.join()
        assert waited >= 1.0  # refused once, then sent again after Retry-After


async def test_async_max_retries_raises_the_last_refusal(one_per_key: Server) -> None:
    async with AsyncDeskbox(one_per_key.url, KEY_A, max_retries=2) as box:
        async with await box.sessions.create(display=DISPLAY):
            started = time.monotonic()
            with pytest.raises(RateLimited):
                await box.sessions.create(display=DISPLAY)
            assert time.monotonic() - started >= 2.0  # two waits of Retry-After (1 s)


@pytest.fixture(scope="module")
def box(local_server: Server) -> Iterator[Deskbox]:
    with Deskbox(local_server.url, KEY_A) as client:
        yield client


@pytest.fixture(scope="module")
def session(box: Deskbox) -> Iterator[Session]:
    created = box.sessions.create(display=DISPLAY, start_url=PAGE, labels={"suite": "sdk"})
    with created:
        yield created


def test_error_mapping(local_server: Server, box: Deskbox, session: Session) -> None:
    with Deskbox(local_server.url, "wrong-key") as stranger:
        with pytest.raises(Unauthorized) as unauthorized:
            stranger.sessions.list()
    assert unauthorized.value.status == 401 and unauthorized.value.type == "unauthorized"
    assert unauthorized.value.request_id and unauthorized.value.request_id.startswith("req_")
    assert unauthorized.value.body["error"]["type"] == "unauthorized"

    with pytest.raises(NotFound) as missing:
        box.sessions.get("ses_does_not_exist")
    assert missing.value.status == 404 and missing.value.type == "not_found"

    with pytest.raises(UnprocessableEntity) as invalid:
        box.sessions.create(display={"width": -5, "height": 10})
    assert invalid.value.status == 422 and invalid.value.type == "invalid_request"
    assert invalid.value.action_index is None  # no action failed: the create was refused

    with pytest.raises(UnprocessableEntity):
        session.act({"type": "no_such_action"})
    # The local backend has no sandbox: exec and files are refused with 422 (API.md).
    with pytest.raises(UnprocessableEntity):
        session.exec(["true"])
    assert isinstance(missing.value, APIError) and isinstance(missing.value, DeskboxError)


def test_acting_on_a_starting_session_is_a_conflict(box: Deskbox) -> None:
    starting = box.sessions.create(display=DISPLAY, wait=False)
    with starting:
        assert starting.state == "starting"
        with pytest.raises(Conflict) as conflict:
            starting.click(10, 10)
        assert conflict.value.status == 409 and conflict.value.type == "conflict"


def test_lifecycle_calls_this_server_lacks_map_to_api_errors(session: Session) -> None:
    """pause/resume/hibernate/snapshot/fork: answered, or refused with a typed error."""
    for call in (session.pause, session.resume, session.hibernate, session.snapshot,
                 lambda: session.fork(1)):
        try:
            result = call()
        except APIError as error:
            assert error.status in (404, 405, 409, 422), error
        else:
            for fork in result if isinstance(result, list) else []:
                fork.close()
    session.refresh()
    if session.state == "paused":
        session.resume()


def test_create_act_screenshot_delete(box: Deskbox, session: Session) -> None:
    assert session.state == "running" and session.display.width == 800
    assert any(s.id == session.id for s in box.sessions.list(labels={"suite": "sdk"}))
    assert box.sessions.get(session.id).labels == {"suite": "sdk"}

    session.click(200, 20)
    session.type("héllo")
    session.key("ctrl+a")
    session.move(300, 300)
    session.scroll(300, 300, dy=1)
    session.drag([(10, 300), (50, 320)])
    # Keys held during a move and a drag reach the desktop: a name it lacks is refused.
    session.move(310, 300, modifiers=["shift"])
    session.drag([(10, 300), (50, 320)], modifiers=["ctrl"])
    with pytest.raises(UnprocessableEntity, match="Hyper_Banana"):
        session.drag([(10, 300), (50, 320)], modifiers=["Hyper_Banana"])
    # In a batch, the error says which action failed (the move before it was done).
    with pytest.raises(UnprocessableEntity, match="Hyper_Banana") as midway:
        session.act([{"type": "move", "x": 50, "y": 320}, {"type": "key", "keys": "Hyper_Banana"},
                     {"type": "wait", "ms": 1}])
    assert midway.value.action_index == 1
    result = session.act(
        [{"type": "move", "x": 50, "y": 320}, {"type": "cursor_position"},
         {"type": "screen_size"}],
        screenshot=True,
    )
    assert result.results == [{}, {"x": 50, "y": 320}, {"width": 800, "height": 600}]
    assert result.screenshot is not None and result.screenshot.media_type == "image/jpeg"
    assert result.screenshot.image().size == (800, 600)

    png = session.screenshot()
    assert png.startswith(b"\x89PNG")
    image = session.screenshot(as_image=True)
    assert image.size == (800, 600)
    assert image.convert("RGB").getpixel((700, 500)) == (0, 0, 255)
    region = session.screenshot(region={"x": 0, "y": 0, "width": 100, "height": 50})
    assert Image.open(io.BytesIO(region)).size == (100, 50)
    small = session.screenshot(format="jpeg", scale=(400, 300))
    assert Image.open(io.BytesIO(small)).size == (400, 300)


def test_links_carry_session_tokens(session: Session) -> None:
    view = session.view_url()
    assert "?token=" in view and view.startswith("http://127.0.0.1")
    assert httpx.get(view, timeout=10).status_code == 200
    cdp = session.cdp_url()
    base, _, token = cdp.partition("?token=")
    version = httpx.get(f"{base}/json/version", params={"token": token}, timeout=10)
    assert version.status_code == 200 and "webSocketDebuggerUrl" in version.json()


def test_websocket_fast_path(session: Session) -> None:
    with session.actions_ws() as ws:
        for _ in range(5):
            session.move(100, 100)
        session.click(120, 130)
        result = session.act({"type": "cursor_position"}, screenshot=True)
        assert result.results == [{"x": 120, "y": 130}]
        assert result.screenshot is not None and result.screenshot.data[:2] == b"\xff\xd8"
        assert session.screenshot(as_image=True).size == (800, 600)
        with pytest.raises(UnprocessableEntity):
            ws.act({"type": "move"})  # no coordinates
        assert ws.act({"type": "screen_size"}).results == [{"width": 800, "height": 600}]
    assert session.act({"type": "cursor_position"}).results == [{"x": 120, "y": 130}]


def test_a_call_that_times_out_on_the_websocket_does_not_shift_the_next_replies(
    session: Session,
) -> None:
    """The late reply stayed queued on the socket and the next call read it as its own:
    results one step behind, an image's bytes taken for JSON."""
    with session.actions_ws():
        with pytest.raises(deskbox.APITimeoutError):
            session.act({"type": "wait", "ms": 1500}, timeout=0.3)
        session.click(140, 150)  # the socket is closed: over HTTP, answered for itself
        assert session.act({"type": "cursor_position"}).results == [{"x": 140, "y": 150}]
        assert session.screenshot(as_image=True).size == (800, 600)


def test_waits_and_holds_lengthen_the_wait_for_an_answer(
    local_server: Server, session: Session,
) -> None:
    """A batch's waits and holds may add up to 60 s (API.md), the client's default timeout:
    the call gave up on a batch the server was still running as asked."""
    with Deskbox(local_server.url, KEY_A, timeout=1) as hasty:
        mine = Session(hasty, session.data)
        batch = [{"type": "wait", "ms": 800},
                 {"type": "hold_key", "keys": "shift", "duration_s": 0.8}]
        assert mine.act(batch).results == [{}, {}]
        with mine.actions_ws():
            assert mine.act({"type": "wait", "ms": 1500}).results == [{}]
            with pytest.raises(deskbox.APITimeoutError):  # a timeout given is kept
                mine.act({"type": "wait", "ms": 1500}, timeout=0.3)
        # The vendors' waits alike: Anthropic's in seconds, OpenAI's a second on the server.
        assert mine.act_anthropic({"action": "wait", "duration": 1.5}).content
        assert mine.act_openai({"actions": [{"type": "wait"}, {"type": "wait"}]}).output


async def test_async_waits_lengthen_the_wait_for_an_answer(
    local_server: Server, session: Session,
) -> None:
    async with AsyncDeskbox(local_server.url, KEY_A, timeout=1) as hasty:
        mine = deskbox.AsyncSession(hasty, session.data)
        assert (await mine.act({"type": "wait", "ms": 1500})).results == [{}]
        async with mine.actions_ws():
            assert (await mine.act({"type": "wait", "ms": 1500})).results == [{}]


def test_every_error_kind_of_the_api_maps_to_its_status() -> None:
    """A websocket error has no HTTP status: the SDK gives it its kind's. Kinds it did not
    know (``human_in_control``, ``secret_origin_mismatch``) became a ServerError 500."""
    table = (Path(__file__).parents[2] / "docs" / "API.md").read_text()
    kinds = dict(re.findall(r"^\s*\| `([a-z_]+)` \| (\d{3})", table, re.MULTILINE))
    assert len(kinds) >= 14 and "human_in_control" in kinds
    for kind, status in kinds.items():
        error = deskbox._base.ws_error({"type": kind, "message": "m"})
        assert (error.status, error.type) == (int(status), kind)


def test_websocket_errors_are_those_of_http(
    local_server: Server, box: Deskbox, session: Session,
) -> None:
    auth = {"Authorization": f"Bearer {KEY_A}"}
    control = f"{local_server.url}/v1/sessions/{session.id}/control"
    assert httpx.post(control, headers=auth, timeout=10).status_code == 200
    try:
        with session.actions_ws():
            with pytest.raises(Conflict) as taken:
                session.click(10, 10)
        assert (taken.value.status, taken.value.type) == (409, "human_in_control")
    finally:
        assert httpx.delete(control, headers=auth, timeout=10).status_code == 200
    # The page is a data: URL, no origin of the secret's.
    box.secrets.create("SDK_PW", "hunter2", ["https://deskbox.invalid"])
    try:
        with session.actions_ws():
            session.click(200, 20)
            with pytest.raises(Forbidden) as refused:
                session.act({"type": "type", "secret": "SDK_PW"})
        assert (refused.value.status, refused.value.type) == (403, "secret_origin_mismatch")
    finally:
        box.secrets.delete("SDK_PW")


async def test_async_websocket_errors_are_those_of_http(
    local_server: Server, session: Session,
) -> None:
    control = f"/v1/sessions/{session.id}/control"
    async with httpx.AsyncClient(base_url=local_server.url, timeout=10,
                                 headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        assert (await http.post(control)).status_code == 200
        try:
            async with AsyncDeskbox(local_server.url, KEY_A) as abox:
                mine = deskbox.AsyncSession(abox, session.data)
                async with mine.actions_ws():
                    with pytest.raises(Conflict) as taken:
                        await mine.click(10, 10)
            assert (taken.value.status, taken.value.type) == (409, "human_in_control")
        finally:
            assert (await http.delete(control)).status_code == 200


# A screen that never goes quiet: a settled screenshot's wait for it times out (2 s).
RESTLESS = ("data:text/html,<style>@keyframes k{from{background:red}to{background:blue}}"
            "body{animation:k .1s infinite alternate}</style><body>")


def test_the_websocket_says_when_the_screen_did_not_settle(local_server: Server) -> None:
    """The websocket's reply says ``"settled": false``; the SDK said True all the same."""
    with Deskbox(local_server.url, KEY_A) as box, \
            box.sessions.create(display=DISPLAY, start_url=RESTLESS) as restless:
        assert restless.act({"type": "move", "x": 5, "y": 5}, screenshot=True).settled is False
        with restless.actions_ws():
            moved = restless.act([{"type": "move", "x": 5, "y": 5}], screenshot=True)
            assert moved.screenshot is not None and moved.settled is False
            assert restless.act({"type": "move", "x": 6, "y": 6}).settled is True  # no look


async def test_async_websocket_says_when_the_screen_did_not_settle(
    local_server: Server,
) -> None:
    async with AsyncDeskbox(local_server.url, KEY_A) as box, \
            await box.sessions.create(display=DISPLAY, start_url=RESTLESS) as restless:
        async with restless.actions_ws():
            moved = await restless.act({"type": "move", "x": 5, "y": 5}, screenshot=True)
            assert moved.screenshot is not None and moved.settled is False


async def test_a_call_cancelled_on_the_websocket_does_not_shift_the_next_replies(
    local_server: Server, session: Session,
) -> None:
    """A call its caller cancelled (``asyncio.wait_for``) left its reply on the socket: the
    next call ran on the desktop but was reported failed (a reply to another message)."""
    async with AsyncDeskbox(local_server.url, KEY_A) as abox:
        mine = deskbox.AsyncSession(abox, session.data)
        async with mine.actions_ws():
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(mine.act({"type": "wait", "ms": 800}), 0.2)
            await asyncio.sleep(1)  # the late reply has come
            await mine.move(160, 170)  # the socket is closed: over HTTP
            assert (await mine.act({"type": "cursor_position"})).results == [
                {"x": 160, "y": 170}]


@pytest.fixture
def dropping_socket(session: Session) -> Iterator[dict[str, Any]]:
    """The session's data with its actions websocket at a local server that answers one
    message and then closes the socket with 1008, as the server does to a client that takes
    no reply for 30 s; its HTTP calls still go to the real server."""

    def answer_once(ws: ServerConnection) -> None:
        message = json.loads(ws.recv())
        ws.send(json.dumps({"id": message["id"], "ok": True, "result": {}}))
        ws.close(1008, "no reply taken for 30 s")

    with serve(answer_once, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        port = server.socket.getsockname()[1]
        raw = dict(session.data.raw)
        raw["urls"] = {**raw["urls"], "actions_ws": f"ws://127.0.0.1:{port}/actions/ws"}
        yield raw
        server.shutdown()
    thread.join(5)


def test_a_websocket_that_cannot_send_is_let_go(box: Deskbox,
                                                dropping_socket: dict[str, Any]) -> None:
    """The broken socket stayed attached: every later call failed on it."""
    mine = Session(box, dropping_socket)
    with mine.actions_ws():
        mine.move(1, 1)
        time.sleep(0.3)  # the server's close has come
        with pytest.raises(APIConnectionError):
            mine.move(180, 190)
        mine.move(180, 190)  # over HTTP
        assert mine.act({"type": "cursor_position"}).results == [{"x": 180, "y": 190}]


async def test_async_websocket_that_cannot_send_is_let_go(
    local_server: Server, dropping_socket: dict[str, Any],
) -> None:
    async with AsyncDeskbox(local_server.url, KEY_A) as abox:
        mine = deskbox.AsyncSession(abox, dropping_socket)
        async with mine.actions_ws():
            await mine.move(1, 1)
            await asyncio.sleep(0.3)
            with pytest.raises(APIConnectionError):
                await mine.move(190, 180)
            await mine.move(190, 180)
            assert (await mine.act({"type": "cursor_position"})).results == [
                {"x": 190, "y": 180}]


def test_closing_is_idempotent_and_a_closed_session_is_gone(box: Deskbox) -> None:
    created = box.sessions.create(display=DISPLAY)
    created.close()
    created.close()
    assert created.refresh().state in ("stopped", "stopping")
    with pytest.raises((NotFound, Conflict)):
        created.click(1, 1)


async def test_async_client(local_server: Server) -> None:
    async with AsyncDeskbox(local_server.url, KEY_A) as box:
        async with await box.sessions.create(display=DISPLAY, start_url=PAGE) as session:
            assert session.state == "running"
            await session.click(10, 10)
            await session.type("x")
            result = await session.act({"type": "cursor_position"}, screenshot=True)
            assert result.results == [{"x": 10, "y": 10}] and result.screenshot is not None
            assert (await session.screenshot()).startswith(b"\x89PNG")
            assert (await session.screenshot(as_image=True)).size == (800, 600)
            async with session.actions_ws():
                await asyncio.gather(*[session.move(20 + i, 20) for i in range(1)])
                shot = await session.screenshot(format="jpeg")
                assert shot[:2] == b"\xff\xd8"
            assert (await session.act({"type": "cursor_position"})).results == [
                {"x": 20, "y": 20}]
            assert "?token=" in await session.view_url("control")
            assert [s.id for s in await box.sessions.list() if s.id == session.id]
            with pytest.raises(UnprocessableEntity):
                await session.exec("true")  # the local backend has no sandbox
        with pytest.raises(NotFound):
            await box.sessions.get("ses_nope")
        with pytest.raises(NotFound):
            await session.click(1, 1)  # deleted on leaving the block


@pytest.mark.parametrize(
    ("format", "options"),
    [("PNG", {}), ("JPEG", {"quality": 70}), ("JPEG", {"progressive": True}),
     ("WEBP", {"quality": 80}), ("WEBP", {"lossless": True}), ("WEBP", {"alpha": True})],
)
def test_image_sizes_read_from_headers(format: str, options: dict[str, Any]) -> None:  # noqa: A002
    """The dialect answers carry images without their size: the SDK reads it from the bytes."""
    from deskbox._models import image_size

    alpha = options.pop("alpha", False)
    image = Image.new("RGBA" if alpha else "RGB", (317, 123), (10, 200, 30, 128))
    encoded = io.BytesIO()
    image.save(encoded, format=format, **options)
    assert image_size(encoded.getvalue()) == (317, 123)
    assert image_size(b"GIF89a....") == (0, 0) and image_size(b"") == (0, 0)


def test_a_create_waits_for_its_session_beyond_the_clients_timeout(
    local_server: Server,
) -> None:
    """A client's timeout fit for actions (60 s by default) cut a create short that a VM
    takes minutes to finish: the call raised and the session it asked for ran on, unknown
    to it. A create that waits does so for at least CREATE_WAIT_S."""
    with deskbox.Deskbox(local_server.url, KEY_A, timeout=0.05) as hasty:
        made = hasty.sessions.create(display={"width": 320, "height": 240})
    with deskbox.Deskbox(local_server.url, KEY_A) as box:
        assert box.sessions.get(made.id).state == "running"
        box.sessions.get(made.id).close()
