"""Fuzz the API from its own OpenAPI document (``GET /openapi.json``) with Schemathesis.

``schemathesis run`` (its CLI, in a subprocess; ``schemathesis.toml`` beside this file)
talks over loopback to a real server started here (local backend) and checks every
answer: no 5xx; status codes, content types, headers and bodies as the document says;
schema-invalid input refused; requests without the key refused; the Allow header of 405s;
every request answered within the timeout (45 s; 2 s of reading for the event stream).
Phases (``DESKBOX_FUZZ_PHASES``): examples, fuzzing (Hypothesis, ``DESKBOX_FUZZ_EXAMPLES``
cases per operation), stateful (call sequences along the document's links: create a
session, act on it, delete it) and, in ``make fuzz``, coverage (boundary values and every
documented alternative). ``st_hooks.py`` sends half the cases to a live session and keeps
each case cheap for the desktop.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..api.conftest import KEY_A, Server
from .conftest import EXAMPLES, PHASES

HERE = Path(__file__).resolve().parent
CLI = Path(sys.executable).parent / "schemathesis"
REQUEST_TIMEOUT_S = 45
# A generous bound for the whole run: ~2 s per example and operation on a loaded machine.
RUN_TIMEOUT_S = 120 + EXAMPLES * 60 * (4 if "coverage" in PHASES else 1)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_schemathesis_finds_nothing(
    fuzz_server: Server, live_session: dict[str, Any], tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": str(HERE / "st_hooks.py"),
        "DESKBOX_FUZZ_SESSION": live_session["id"],
    }
    command = [
        str(CLI), "--no-color", "--config-file", str(HERE / "schemathesis.toml"), "run",
        f"{fuzz_server.url}/openapi.json",
        "--header", f"Authorization: Bearer {KEY_A}",
        "--phases", PHASES,
        "--max-examples", str(EXAMPLES),
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--workers", "1",
        "--report", "ndjson", "--report-dir", str(tmp_path / "report"),
    ]
    result = subprocess.run(
        command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=RUN_TIMEOUT_S,
    )
    # The whole report (with a curl line per failure) is in the test's output.
    print(result.stdout, result.stderr, sep="\n")
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", result.stdout)
    assert counts is not None and int(counts[2]) > 0, "no case ran"
