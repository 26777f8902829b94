"""What the fuzzer found, pinned: each case failed before its fix (real HTTP, loopback)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ..api.helpers import assert_error


def test_405_names_every_method_of_the_path(fuzz_client: httpx.Client) -> None:
    # Starlette named only the first route's method ("Allow: POST" for /v1/sessions).
    for method, path, allowed in [
        ("OPTIONS", "/v1/sessions", "GET, POST"),
        ("PUT", "/v1/sessions/ses_x", "DELETE, GET"),
        ("POST", "/v1/sessions/ses_x/files", "GET, PUT"),
    ]:
        response = fuzz_client.request(method, path)
        assert_error(response, 405, "method_not_allowed")
        assert response.headers["allow"] == allowed


def test_body_that_is_not_utf8_is_invalid_json(
    fuzz_client: httpx.Client, live_session: dict[str, Any]
) -> None:
    # Was a 400 the document did not mention ("There was an error parsing the body").
    response = fuzz_client.post(f"/v1/sessions/{live_session['id']}/tokens",
                                content=b'{"scope": "\xff"}',
                                headers={"Content-Type": "application/json"})
    error = assert_error(response, 422, "invalid_request")
    assert "not valid JSON" in error["message"]


def test_chunked_body_past_the_cap_is_413(
    fuzz_client: httpx.Client, live_session: dict[str, Any]
) -> None:
    # Without Content-Length the cap is found while FastAPI reads the body, which turned
    # the middleware's 413 into a 400.
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "type", "text": "'
        for _ in range(5 * 1024):
            yield b"a" * 1024
        yield b'"}'

    response = fuzz_client.post(f"/v1/sessions/{live_session['id']}/actions",
                                content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(response, 413, "invalid_request")


@pytest.mark.parametrize("body", [
    {"type": "click", "x": True, "y": 5},
    {"type": "wait", "ms": "5"},
    {"type": "screenshot", "cursor": "yes"},
    {"type": "hold_key", "keys": "a", "duration_s": False},
    {"actions": [{"type": "move", "x": 5, "y": 5}], "coordinate_space": {"width": "640",
                                                                        "height": 400}},
])
def test_numbers_and_booleans_are_what_the_schema_says(
    fuzz_client: httpx.Client, live_session: dict[str, Any], body: dict[str, Any]
) -> None:
    # Pydantic's lax mode read true as 1 and "5" as 5: schema-invalid bodies were run.
    response = fuzz_client.post(f"/v1/sessions/{live_session['id']}/actions", json=body)
    assert_error(response, 422, "invalid_request")


def test_integral_floats_are_still_integers(
    fuzz_client: httpx.Client, live_session: dict[str, Any]
) -> None:
    # JSON Schema's integer includes 640.0, and agents compute coordinates by division.
    response = fuzz_client.post(f"/v1/sessions/{live_session['id']}/actions",
                                json={"type": "move", "x": 640.0, "y": 400.0})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("path", "params", "body"), [
    ("screenshot", {"scale": "16384x16384"}, None),
    ("actions", None, {"type": "screenshot", "scale": {"width": 10000, "height": 10000}}),
    ("actions", None, {"type": "move", "x": 1, "y": 1,
                       "coordinate_space": {"width": 16384, "height": 4000}}),
    ("actions/anthropic", {"coordinate_space": "9000x9000"}, {"action": "screenshot"}),
])
def test_images_larger_than_the_largest_display_are_refused(
    fuzz_client: httpx.Client, live_session: dict[str, Any], path: str,
    params: dict[str, str] | None, body: dict[str, Any] | None,
) -> None:
    # A 16384x16384 scale made the server allocate ~3 GB for one screenshot.
    url = f"/v1/sessions/{live_session['id']}/{path}"
    response = (fuzz_client.get(url, params=params) if body is None
                else fuzz_client.post(url, params=params, json=body))
    error = assert_error(response, 422, "invalid_request")
    assert "pixels" in error["message"]


def test_the_document_describes_every_answer(fuzz_client: httpx.Client) -> None:
    document = fuzz_client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["ErrorBody"]["properties"]) == {"error"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
            if path.startswith("/v1/"):
                assert {"api_key": []} in operation["security"], (method, path)
                assert {"401", "422", "500"} <= set(operation["responses"]), (method, path)
    links = document["paths"]["/v1/sessions"]["post"]["responses"]["201"]["links"]
    assert len(links) >= 10
    assert all(link["parameters"] == {"session_id": "$response.body#/id"}
               for link in links.values())
