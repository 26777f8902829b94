"""POSTs that take no body refuse one with fields (422) instead of ignoring it."""

from __future__ import annotations

import httpx
import pytest

from .helpers import assert_error


@pytest.mark.parametrize("path", ["resume", "keepalive", "snapshots", "recording/start",
                                  "recording/stop"])
def test_a_post_that_takes_no_body_refuses_fields(client: httpx.Client, path: str) -> None:
    """A snapshot's "name" was ignored, and the snapshot taken without one; now the request
    is refused before anything is done (here on a session that does not exist: the body is
    refused first, so nothing about the session is told either)."""
    url = f"/v1/sessions/ses_nothere/{path}"
    message = assert_error(client.post(url, json={"name": "before-login"}), 422,
                           "invalid_request")["message"]
    assert message == f"POST {url} takes no body, or {{}}: it has name", message
    assert_error(client.post(url, content=b"[1]"), 422, "invalid_request")
    # JSON nested deeper than the parser recurses (json.loads: RecursionError) is just as bad.
    assert_error(client.post(url, content=b"[" * 5000), 422, "invalid_request")
    # No body, {} and null are what clients send: the call goes on (to its 404 here).
    for body in (None, {}, b"null"):
        sent = client.post(url, content=body) if isinstance(body, bytes) else \
            client.post(url, json=body)
        assert_error(sent, 404, "not_found")
    # The key is checked first: a body tells nothing to a caller without one.
    assert_error(httpx.post(str(client.base_url.join(url)), json={"name": "x"}), 401,
                 "unauthorized")
