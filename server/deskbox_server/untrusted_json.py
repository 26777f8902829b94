"""JSON from outside the server: a client's request, the agent's replies, the browser's
DevTools answers.

``json.loads`` raises ``RecursionError``, not ``ValueError``, on arrays or objects nested a
few thousand deep, which a body of a few KiB can hold: here it is a ``ValueError`` like
every other malformed input, so that the callers' one ``except ValueError`` covers it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["loads"]


def loads(raw: bytes | bytearray | memoryview | str) -> Any:
    try:
        return json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
