"""Schemathesis hooks of the fuzz run (loaded by the ``schemathesis`` CLI, not by pytest).

Three things, each applied to a request just before it is sent (so the printed
reproduction of a failure is what was really sent):

- **Live session**: about half the cases on one session (chosen by a hash of the generated
  id, so a case replays the same way) go to ``DESKBOX_FUZZ_SESSION``, a running desktop,
  instead of an id that does not exist: the server's answers past the 404 get fuzzed too.
  Deleting it, and its event stream (which lasts as long as the session), are left to
  the stateful phase's own sessions.
- **Taming**: a valid case that would keep the desktop busy for minutes (a batch of 60 s
  waits, 20,000 characters typed one key at a time, an 8K display) is legal but tests the
  desktop's throughput, not the API; such values are cut down to cheap ones of the same
  shape. Start URLs become ``about:blank``: the local backend's browser shares the host's
  network, and the fuzzer must not send traffic anywhere. A handoff's long poll and a
  human's lease are cut to a moment.
- **Fresh idempotency keys** on the stateful phase's creates: a key drawn again would
  be a retry, answered with an earlier, perhaps deleted, session (`_fresh_idempotency_key`).

And one check, ``negative_data_rejected``, in place of Schemathesis's
``negative_data_rejection`` (disabled in schemathesis.toml): a case generated as invalid
whose body, *as sent*, is valid by the document is not a finding. Schemathesis sometimes
tags a valid body as mutated (a ``oneOf`` branch's enum "violated" by a value of that very
enum: schemathesis/schemathesis#3603 is the same kind), and taming can cut an invalid
value down to a valid one. Everything else goes to Schemathesis's own check.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from collections.abc import MutableMapping
from typing import Any

import jsonschema
import schemathesis
from schemathesis.specs.openapi.checks import negative_data_rejection

LIVE_SESSION = os.environ.get("DESKBOX_FUZZ_SESSION", "")
_SESSION_PATH = "/v1/sessions/{session_id}"
_START_URL_SCHEMES = ("http:", "https:", "file:", "data:", "about:")
_CHEAP: dict[str, dict[str, float]] = {
    # action type: {field: cap}
    "wait": {"ms": 20},
    "hold_key": {"duration_s": 0.02},
}
_MAX_TEXT = 40
_MAX_POINTS = 8
_MAX_BATCH = 8
_MAX_SCREEN = (1280, 800)
_MAX_IMAGE_SIDE = 1600


def _capped(value: Any, cap: float) -> Any:
    """``value`` capped when it is a number past ``cap``; anything else as it is."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > cap:
        return type(value)(cap)
    return value


def _tame_size(size: Any, cap: tuple[int, int]) -> None:
    if isinstance(size, dict):
        for key, limit in zip(("width", "height"), cap, strict=True):
            if key in size:
                size[key] = _capped(size[key], limit)


def _tame_action(action: Any) -> None:
    if not isinstance(action, dict):
        return
    kind = action.get("type")
    for field, cap in _CHEAP.get(str(kind), {}).items():
        if field in action:
            action[field] = _capped(action[field], cap)
    for field in ("text",):
        if isinstance(action.get(field), str):
            action[field] = action[field][:_MAX_TEXT]
    if isinstance(action.get("path"), list):
        action["path"] = action["path"][:_MAX_POINTS]
    for field in ("scale", "coordinate_space"):
        _tame_size(action.get(field), (_MAX_IMAGE_SIDE, _MAX_IMAGE_SIDE))


def _tame_actions(body: dict[str, Any]) -> None:
    actions = body.get("actions")
    if isinstance(actions, list):
        del actions[_MAX_BATCH:]
        for action in actions:
            _tame_action(action)
    else:
        _tame_action(body)
    _tame_action(body.get("screenshot"))
    _tame_size(body.get("coordinate_space"), (_MAX_IMAGE_SIDE, _MAX_IMAGE_SIDE))


def _tame_create(body: dict[str, Any]) -> None:
    browser = body.get("browser")
    if isinstance(browser, dict) and isinstance(browser.get("start_url"), str):
        if browser["start_url"].lower().startswith(_START_URL_SCHEMES):
            browser["start_url"] = "about:blank"
    _tame_size(body.get("display"), _MAX_SCREEN)


def _tame_dialect(body: dict[str, Any]) -> None:
    """Anthropic's ``input`` / OpenAI's ``action``: the same cheap caps by field name."""
    for holder in (body, body.get("action")):
        if not isinstance(holder, dict):
            continue
        if isinstance(holder.get("text"), str):
            holder["text"] = holder["text"][:_MAX_TEXT]
        for field in ("duration", "ms", "scroll_amount"):
            if field in holder:
                holder[field] = _capped(holder[field], 1)
        if isinstance(holder.get("path"), list):
            holder["path"] = holder["path"][:_MAX_POINTS]
    if isinstance(body.get("actions"), list):
        del body["actions"][_MAX_BATCH:]
        for action in body["actions"]:
            if isinstance(action, dict):
                _tame_dialect(action)


def _use_live_session(case: Any) -> None:
    ids = case.path_parameters
    if not LIVE_SESSION or not isinstance(ids, dict) or "session_id" not in ids:
        return
    if case.method.upper() == "DELETE" and case.path == _SESSION_PATH:
        return
    if case.path.endswith("/events"):
        return  # a live session's stream ends with the session: each case would time out
    if case.meta is not None and str(case.meta.phase.name) == "stateful":
        return  # its ids come from the sessions it created
    if zlib.crc32(repr(ids["session_id"]).encode()) % 2 == 0:
        ids["session_id"] = LIVE_SESSION


def _in_range(value: Any, low: float, high: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and low < value <= high


def _number(value: Any) -> Any:
    """A query value as the server reads it: the coverage phase sends numbers as text."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _tame_handoff(case: Any) -> None:
    """A long poll waits for a human who never comes, and a human's lease keeps the live
    session's actions at 409: both cut to a moment. Only valid values are cut (an invalid
    one stays invalid, for the server to refuse), and a missing one is given."""
    if case.method.upper() != "POST":
        return
    if case.path.endswith("/handoff"):
        if not isinstance(case.query, dict):
            case.query = {}
        wait = _number(case.query.get("timeout_s", 60.0))
        if _in_range(wait, 0, 600):
            case.query["timeout_s"] = min(wait, 0.2)
    if case.path.endswith("/control"):
        if case.body is None:
            case.body = {}
        if isinstance(case.body, dict):
            lease = case.body.get("lease_s", 600)
            if isinstance(lease, int) and _in_range(lease, 0, 86_400):
                case.body["lease_s"] = 1


def _fresh_idempotency_key(case: Any) -> None:
    """A stateful sequence's create gets a key of its own. Its checks take every 201 of a
    create for a new session, but a key the run sent before (the generator draws few, "N"
    again and again) is a retry, answered with the session that key made, perhaps deleted
    since and so ``stopped`` (docs/API.md, "Retrying a create"): the sequence's next call
    on it is then a 404 by design. The other phases keep the keys as drawn."""
    if case.meta is None or str(case.meta.phase.name) != "stateful":
        return
    headers = case.headers  # a case-insensitive mapping, not a dict
    key = headers.get("Idempotency-Key") if isinstance(headers, MutableMapping) else None
    if isinstance(key, str):
        headers["Idempotency-Key"] = f"{key[:200]}-{uuid.uuid4().hex[:12]}"


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    _use_live_session(case)
    _tame_handoff(case)
    if case.path == "/v1/sessions" and case.method.upper() == "POST":
        _fresh_idempotency_key(case)
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path == "/v1/sessions" and case.method.upper() == "POST":
        _tame_create(body)
    elif case.path.endswith("/actions"):
        _tame_actions(body)
    elif case.path.endswith("/view/type"):
        _tame_action(body)  # its text, as a ``type`` action's
    elif case.path.endswith(("/actions/anthropic", "/actions/openai")):
        _tame_dialect(body)


def _operation(case: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The OpenAPI document and the case's operation in it."""
    document: dict[str, Any] = case.operation.schema.raw_schema
    return document, document["paths"][case.path][case.method.lower()]


def _sent_body_is_valid(case: Any, response: Any) -> bool:
    """Whether the JSON body that went out is valid by the operation's request schema."""
    document, method = _operation(case)
    schema = method.get("requestBody", {}).get("content", {}).get("application/json", {})
    sent = response.request.body
    if "schema" not in schema or not sent:
        return False
    try:
        body = json.loads(sent)
    except ValueError:
        return False
    resolvable = {**schema["schema"], "components": document.get("components", {})}
    return bool(jsonschema.Draft202012Validator(resolvable).is_valid(body))


def _negative_in(case: Any) -> set[str]:
    meta = case.meta
    if meta is None:
        return set()
    return {str(location.name) for location, component in meta.components.items()
            if component.mode.is_negative}


def _query_is_valid_but_for_extras(case: Any) -> bool:
    """Whether every query parameter the operation defines that went out is valid: a query
    made negative only by parameters the operation does not define is not invalid here,
    since the API ignores those (as HTTP APIs do; they are not in the contract)."""
    document, method = _operation(case)
    query = case.query if isinstance(case.query, dict) else {}
    defined = [p for p in method.get("parameters", []) if p.get("in") == "query"]
    names = {p["name"] for p in defined}
    if names >= set(query):
        return False  # nothing extra: the negative part is in a defined parameter
    for parameter in defined:
        if parameter["name"] not in query:
            continue
        schema = {**parameter.get("schema", {}), "components": document.get("components", {})}
        if not jsonschema.Draft202012Validator(schema).is_valid(query[parameter["name"]]):
            return False
    return True


def _path_is_valid(case: Any) -> bool:
    """Whether the path parameters that went out are valid by their schemas: a negative one
    that before_call replaced by the live session's id is not invalid any more."""
    document, method = _operation(case)
    ids = case.path_parameters if isinstance(case.path_parameters, dict) else {}
    for parameter in method.get("parameters", []):
        if parameter.get("in") != "path":
            continue
        schema = {**parameter.get("schema", {}), "components": document.get("components", {})}
        if parameter["name"] not in ids or not jsonschema.Draft202012Validator(
                schema).is_valid(ids[parameter["name"]]):
            return False
    return True


@schemathesis.check
def negative_data_rejected(ctx: Any, response: Any, case: Any) -> bool | None:
    negative = _negative_in(case)
    # Negative only by what did not go out as invalid: a body that went out valid, a query
    # whose one fault is a parameter the operation does not define (alone too: seen once,
    # a valid body under a query of strangers), a path replaced by the live session's id.
    rest = negative - {"PATH"}
    if (rest and rest <= {"BODY", "QUERY"}
            and ("BODY" not in rest or _sent_body_is_valid(case, response))
            and ("QUERY" not in rest or _query_is_valid_but_for_extras(case))
            and ("PATH" not in negative or _path_is_valid(case))):
        return None
    return negative_data_rejection(ctx, response, case)  # type: ignore[no-any-return]
