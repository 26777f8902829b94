"""The docs' curl examples send JSON as the API takes it.

The API refuses a JSON body sent as a form (422: "sent as application/json"), and curl's
`-d` sends exactly that; a reader copies the example as printed (README's secrets example
did, and failed).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_doc_links import ROOT, markdown_files

_FORM_JSON = re.compile(r"(?:\s-d|--data(?:-raw)?)\s+'\{")


def form_encoded_json(text: str) -> list[str]:
    """The lines of `text` that hand curl a JSON object as form data."""
    return [line.strip() for line in text.splitlines() if _FORM_JSON.search(line)]


def test_no_example_sends_json_as_a_form() -> None:
    found = {str(path.relative_to(ROOT)): form_encoded_json(path.read_text(encoding="utf-8"))
             for path in markdown_files(ROOT)}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_a_form_encoded_json_example_is_found(tmp_path: Path) -> None:
    page = tmp_path / "README.md"
    page.write_text("curl $U/v1/secrets \\\n  -d '{\"name\": \"X\"}'\ncurl --json '{\"a\": 1}'\n"
                    "curl -X PUT --data-binary @f.pdf $U\n")
    assert form_encoded_json(page.read_text()) == ["-d '{\"name\": \"X\"}'"]
