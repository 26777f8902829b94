"""Structured logs: one JSON object per line, with the request id when there is one.

Query strings never reach a log line: session tokens travel as ``?token=`` and must not be
written anywhere.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

__all__ = ["JsonFormatter", "RedactTokens", "configure_logging"]

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is kept.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


_TOKENS = re.compile(r"(token=)[^&\s\"']+|dbt_[A-Za-z0-9_-]+")


def _redact(text: str) -> str:
    return _TOKENS.sub(lambda m: (m[1] or "") + "[redacted]", text)


class RedactTokens(logging.Filter):
    """Blanks session tokens out of a record (uvicorn logs websocket URLs with their query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "token=" in message or "dbt_" in message:
            record.msg, record.args = _redact(message), None
        for key, value in vars(record).items():
            if key not in _STANDARD and isinstance(value, str) and (
                "token=" in value or "dbt_" in value
            ):
                setattr(record, key, _redact(value))
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(RedactTokens())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log prints query strings (tokens): RequestContext logs requests instead.
    logging.getLogger("uvicorn.access").disabled = True
