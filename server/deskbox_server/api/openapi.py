"""``GET /openapi.json`` as the server really answers: auth and every error body documented.

FastAPI documents its own validation error (``{"detail": [...]}``) for 422 and no other
error, while the server answers every non-2xx with :class:`~deskbox_server.schemas.errors.
ErrorBody` (api/errors.py). :func:`install_openapi` rewrites the generated document once,
for every route, including routers added later:

- each error status an operation can answer is documented with ``ErrorBody`` (FastAPI's
  422 replaced, its ``HTTPValidationError`` schemas dropped);
- ``/v1`` operations name their credentials: the API key as a bearer header, and for the
  routes a browser or Playwright opens, a session token as ``?token=`` too;
- ``POST /v1/sessions`` links its answer's ``id`` to every operation on one session, and
  ``POST .../tokens`` its token's ``id`` to the revocation, so generated clients and
  stateful testers (tests/fuzz/) know how calls chain.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from ..schemas.errors import ErrorBody

__all__ = ["TOKEN_TAGS", "describe", "error_statuses", "install_openapi"]

# Routers whose routes take a session token (api/tokens.py authorize()), by their tag.
TOKEN_TAGS = frozenset({"live view", "cdp"})

_ERROR_REF = "#/components/schemas/ErrorBody"
_FASTAPI_ERRORS = ("HTTPValidationError", "ValidationError")
_CREATE = ("post", "/v1/sessions")
_TOKENS = "/v1/sessions/{session_id}/tokens"
# Served without a credential too: the live view's page alone, for a reload (api/vnc.py).
_PAGE_ALONE = ("get", "/v1/sessions/{session_id}/view")
_TOKEN = _TOKENS + "/{token_id}"
_SNAPSHOTS = "/v1/sessions/{session_id}/snapshots"
# Collections of the key's own resources: a create can find the name taken or the quota full.
_NAMED = {"/v1/volumes": "/v1/volumes/{name}", "/v1/secrets": "/v1/secrets/{name}"}
# Where a `type` action of a secret can be refused (secret_origin_mismatch).
_ACTIONS = ("/actions", "/actions/anthropic", "/actions/openai")
_METHODS = ("get", "put", "post", "delete", "patch")
# Where a checkpoint is written or unpacked on the server's disk, or the session's record
# saved in the registry, which a full disk refuses (insufficient_storage).
_DISK_WRITES = ("/pause", "/resume", "/snapshots", "/fork", "/keepalive")
_DESCRIPTIONS = {
    401: "unauthorized: missing or invalid API key (or session token)",
    403: "forbidden: the session token is for another session or scope; "
         "secret_origin_mismatch: a secret's page does not have the keyboard focus",
    404: "not_found: no such session (or other resource) for this key",
    408: "timeout: the request body stopped arriving (see body_idle_timeout_s)",
    409: "conflict: the session is not in a state that allows this (e.g. paused)",
    413: "invalid_request: the request body is larger than the server accepts",
    422: "invalid_request: the request is malformed or asks for something impossible",
    429: "capacity: too many sessions, tokens, connections or video encodes, see "
         "Retry-After; "
         "quota_exceeded: the key's snapshots, volumes, recordings or secrets fill its "
         "quota (no Retry-After: only a delete frees it)",
    500: "internal: the server failed (logged with the request id)",
    502: "session_failed: the session's desktop or sandbox failed",
    504: "timeout: the session did not answer in time",
    507: "insufficient_storage: no room on the server's disk to keep the checkpoint or "
         "the session's record; the session is as it was",
}


def error_statuses(method: str, path: str, tags: frozenset[str], has_body: bool) -> list[int]:
    """The error statuses an operation can answer (every one with ErrorBody)."""
    statuses = {500}
    if path.startswith("/v1/"):
        statuses |= {401, 422}
        # An operation that names a resource or creates one reaches a session (its backend,
        # its worker, its sandbox): the session's own errors can come back.
        if "{" in path or (method, path) == _CREATE:
            statuses |= {404, 409, 429, 502, 504}
        if method == "post" and path in _NAMED:
            statuses |= {409, 429}
        if tags & TOKEN_TAGS or (method == "post" and path.endswith(_ACTIONS)):
            statuses.add(403)
        if method == "post" and (path.endswith(_DISK_WRITES) or (method, path) == _CREATE):
            statuses.add(507)
    if has_body:
        statuses |= {408, 413}
    return sorted(statuses)


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[status],
        "content": {"application/json": {"schema": {"$ref": _ERROR_REF}}},
    }
    if status == 429:
        response["headers"] = {"Retry-After": {
            "description": "seconds to wait before trying again (capacity only)",
            "schema": {"type": "integer"},
        }}
    return response


def _links_to(paths: dict[str, Any], parameter: str, prefix: str, field: str = "id"
              ) -> dict[str, Any]:
    """Links from an answer's ``field`` to every operation under ``prefix`` (its
    resource)."""
    links: dict[str, Any] = {}
    for path, operations in paths.items():
        if not path.startswith(prefix):
            continue
        for method, operation in operations.items():
            if method in _METHODS and "operationId" in operation:
                links[operation["operationId"]] = {
                    "operationId": operation["operationId"],
                    "parameters": {parameter: f"$response.body#/{field}"},
                }
    return links


def _session_links(paths: dict[str, Any]) -> dict[str, Any]:
    return _links_to(paths, "session_id", "/v1/sessions/{session_id}")


def describe(document: dict[str, Any]) -> dict[str, Any]:
    """A copy of FastAPI's document with the errors, credentials and links of the API."""
    document = copy.deepcopy(document)
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    error_schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorBody"] = error_schema
    for name in _FASTAPI_ERRORS:
        schemas.pop(name, None)
    components["securitySchemes"] = {
        "api_key": {"type": "http", "scheme": "bearer",
                    "description": "Authorization: Bearer <api-key>"},
        "session_token": {"type": "apiKey", "in": "query", "name": "token",
                          "description": "a session token (POST /v1/sessions/{id}/tokens)"},
    }
    paths: dict[str, Any] = document.get("paths", {})
    for path, operations in paths.items():
        for method, operation in operations.items():
            if method not in _METHODS:
                continue
            tags = frozenset(operation.get("tags", ()))
            responses = operation.setdefault("responses", {})
            for status in error_statuses(method, path, tags, "requestBody" in operation):
                responses[str(status)] = _error_response(status)
            if path.startswith("/v1/"):
                operation["security"] = [{"api_key": []}]
                if tags & TOKEN_TAGS:
                    operation["security"].append({"session_token": []})
                if (method, path) == _PAGE_ALONE:
                    operation["security"].append({})
    created = paths.get(_CREATE[1], {}).get(_CREATE[0], {}).get("responses", {}).get("201")
    if created is not None:
        created["links"] = _session_links(paths)
    snapshot = paths.get(_SNAPSHOTS, {}).get("post", {}).get("responses", {}).get("201")
    if snapshot is not None:
        snapshot["links"] = _links_to(paths, "snapshot_id", "/v1/snapshots/{snapshot_id}")
    for collection, resource in _NAMED.items():
        made = paths.get(collection, {}).get("post", {}).get("responses", {}).get("201")
        if made is not None:
            made["links"] = _links_to(paths, "name", resource, "name")
    issued = paths.get(_TOKENS, {}).get("post", {}).get("responses", {}).get("201")
    revoke = paths.get(_TOKEN, {}).get("delete", {}).get("operationId")
    if issued is not None and revoke is not None:
        issued["links"] = {revoke: {"operationId": revoke, "parameters": {
            "session_id": "$request.path.session_id", "token_id": "$response.body#/id",
        }}}
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`describe` of FastAPI's document, built once on the first request."""
    generate: Callable[[], dict[str, Any]] = app.openapi
    described: list[dict[str, Any]] = []

    def openapi() -> dict[str, Any]:
        if not described:
            described.append(describe(generate()))
        return described[0]

    app.openapi = openapi  # type: ignore[method-assign]
