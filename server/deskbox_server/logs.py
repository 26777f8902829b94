"""Logs: one JSON object per line for machines, one readable line for a person at a terminal.

Both carry the same fields (a record's ``extra=``: request id, status, duration, ...).
``configure_logging`` picks text when the log stream is a terminal, else JSON lines.

Query strings never reach a log line: session tokens travel as ``?token=`` and must not be
written anywhere.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any, Literal, TextIO

__all__ = ["JsonFormatter", "LogFormat", "RedactTokens", "TextFormatter", "configure_logging"]

LogFormat = Literal["auto", "json", "text"]

# Attributes every LogRecord has; anything else was passed with ``extra=`` and is kept.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# uvicorn's ``color_message`` repeats the message with ANSI codes: noise in either format
# (RedactTokens still blanks it, for any other handler).
_NOT_SHOWN = _STANDARD | {"color_message"}


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


def _fields(record: logging.LogRecord) -> dict[str, str | int | float | bool]:
    """What the record was given with ``extra=``, as JSON-able scalars."""
    return {
        key: value if isinstance(value, str | int | float | bool) else str(value)
        for key, value in vars(record).items()
        if key not in _NOT_SHOWN and not key.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


_COLORS = {"WARNING": "\x1b[33m", "ERROR": "\x1b[31m", "CRITICAL": "\x1b[1;31m"}


class TextFormatter(logging.Formatter):
    """``14:03:07.412 INFO  deskbox.access  GET /v1/sessions 200  request_id=req_… ...``

    Local time of day (a person watching a terminal; JSON lines keep UTC dates), the level
    padded so messages line up, then the record's fields as ``key=value``.
    """

    def __init__(self, color: bool = False) -> None:
        super().__init__()
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        level = f"{record.levelname:<7}"
        if self.color and record.levelname in _COLORS:
            level = f"{_COLORS[record.levelname]}{level}\x1b[0m"
        # uvicorn logs everything but access lines as "uvicorn.error", info included.
        name = "uvicorn" if record.name == "uvicorn.error" else record.name
        line = f"{clock}.{int(record.msecs):03d} {level} {name}  {record.getMessage()}"
        fields = " ".join(f"{key}={_quoted(value)}" for key, value in _fields(record).items())
        if fields:
            line += "  " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quoted(value: str | int | float | bool) -> str:
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if not text or re.search(r"[\s\"=]", text) else text


def configure_logging(
    level: str = "info", log_format: LogFormat = "auto", stream: TextIO | None = None
) -> Literal["json", "text"]:
    """Log to ``stream`` (stderr): text on a terminal, JSON lines otherwise, unless told.

    Returns the format chosen.
    """
    stream = stream or sys.stderr
    tty = stream.isatty()
    chosen: Literal["json", "text"] = (
        ("text" if tty else "json") if log_format == "auto" else log_format
    )
    handler = logging.StreamHandler(stream)
    if chosen == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter(color=tty and not os.environ.get("NO_COLOR")))
    handler.addFilter(RedactTokens())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's access log prints query strings (tokens): RequestContext logs requests instead.
    logging.getLogger("uvicorn.access").disabled = True
    return chosen
