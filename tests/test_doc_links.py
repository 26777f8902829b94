"""Every link of the repository's markdown stays inside the repository and finds its file.

A reader of a clone (or of the repository on a forge) has only what is in it: a link to
`../shared/API.md` or to a file that moved is a dead end.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]

# The documents a newcomer is pointed to; any other markdown file is checked too.
REQUIRED = ("README.md", "LICENSE", "docs/API.md", "docs/ARCHITECTURE.md", "docs/SECURITY.md",
            "docs/GUIDE.md", "bench/README.md", "tests/README.md")

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
_EXTERNAL = re.compile(r"^(?:https?:|mailto:)", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def anchors(text: str) -> set[str]:
    """The fragment ids a forge gives the headings of `text` (GitHub's rule: lower case,
    punctuation dropped, spaces to hyphens, repeats numbered)."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in _HEADING.findall(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return ids


def markdown_files(root: Path) -> list[Path]:
    skip = {"node_modules", "results"}
    return sorted(
        path for path in root.rglob("*.md")
        if not any(part.startswith(".") or part in skip for part in path.relative_to(root).parts)
    )


def link_targets(text: str) -> Iterator[str]:
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    yield from _INLINE.findall(prose)
    yield from _REFERENCE.findall(prose)


def bad_links(path: Path, root: Path) -> list[str]:
    """The links of `path` that leave `root` or name nothing, each with the reason."""
    bad = []
    text = path.read_text(encoding="utf-8")
    for target in link_targets(text):
        if _EXTERNAL.match(target):
            continue
        if target.startswith("#"):
            if target[1:] not in anchors(text):
                bad.append(f"{target}: no such heading")
            continue
        if ":" in target.split("/")[0]:
            bad.append(f"{target}: a scheme other than http(s) or mailto")
            continue
        file_part = target.split("#")[0].split("?")[0]
        if file_part.startswith("/"):
            bad.append(f"{target}: an absolute path")
            continue
        resolved = (path.parent / file_part).resolve()
        if not resolved.is_relative_to(root.resolve()):
            bad.append(f"{target}: outside the repository")
        elif not resolved.exists():
            bad.append(f"{target}: no such file")
        elif "#" in target and resolved.suffix == ".md":
            fragment = target.split("#", 1)[1]
            if fragment not in anchors(resolved.read_text(encoding="utf-8")):
                bad.append(f"{target}: no such heading")
    return bad


def test_the_documents_a_newcomer_is_pointed_to_exist() -> None:
    assert [name for name in REQUIRED if not (ROOT / name).is_file()] == []


def test_no_markdown_link_leaves_the_repository_or_dangles() -> None:
    files = markdown_files(ROOT)
    assert ROOT / "README.md" in files and ROOT / "docs" / "API.md" in files
    found = {str(path.relative_to(ROOT)): bad_links(path, ROOT) for path in files}
    assert {name: links for name, links in found.items() if links} == {}


def test_a_bad_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "API.md").write_text("# API\n\n## Sessions (`/v1`)\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Top\n[ok](docs/API.md#sessions-v1) [web](https://example.org) [here](#top)\n"
        "[no heading](docs/API.md#tokens) [nor here](#bottom)\n"
        "[gone](../shared/API.md) [moved](docs/ARCHITECTURE.md) [abs](/etc/passwd)\n"
        "`[not a link](nowhere.md)`\n"
        "```\n[in code](nowhere.md)\n```\n"
        "[ref]: docs/missing.md\n"
    )
    assert bad_links(page, tmp_path) == [
        "docs/API.md#tokens: no such heading",
        "#bottom: no such heading",
        "../shared/API.md: outside the repository",
        "docs/ARCHITECTURE.md: no such file",
        "/etc/passwd: an absolute path",
        "docs/missing.md: no such file",
    ]
