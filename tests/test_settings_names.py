"""Every ``DESKBOX_*`` name: ``deskbox serve`` refuses one that nothing of Deskbox reads (a
misspelt setting ran the server on the default without a word), so each name this
repository uses is a setting or one of ``OTHER_NAMES``; and docs/GUIDE.md's table of
settings lists every setting, and nothing else."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from deskbox_server.settings import Settings, unknown_names

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bDESKBOX_[A-Z0-9_]*[A-Z0-9]\b")
# Files that name wrong settings on purpose.
MISSPELT = {"tests/api/test_serve_refusals.py", "tests/test_settings_names.py"}
SETTINGS = {name.upper() for name in Settings.model_fields}


def names_used() -> dict[str, str]:
    """Each DESKBOX_* name in the repository's files, with a file that has it."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    used: dict[str, str] = {}
    for name in sorted(set(files) - MISSPELT):
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for found in NAME.findall(text):
            used.setdefault(found, name)
    return used


def test_every_name_the_repository_uses_is_known() -> None:
    used = names_used()
    assert len(used) > 50, used
    unknown = unknown_names(dict.fromkeys(used, ""))
    assert not unknown, [f"{said}, in {used[said.split()[0]]}" for said in unknown]


def test_unknown_names_are_said_with_the_closest_setting() -> None:
    assert unknown_names({"DESKBOX_URL": "x", "DESKBOX_PORT": "1", "HOME": "/"}) == []
    assert unknown_names({"DESKBOX_STATEDIR": "/x", "DESKBOX_ZZZ": "1"}) == [
        "DESKBOX_STATEDIR is not a setting (did you mean DESKBOX_STATE_DIR?)",
        "DESKBOX_ZZZ is not a setting",
    ]


def test_the_service_links_of_kubernetes_pass() -> None:
    """Kubernetes gives a pod's containers these for each Service of its namespace: the
    server's own Service (deskbox-server) would have kept it from starting."""
    links = {"DESKBOX_SERVER_SERVICE_HOST": "10.0.0.7", "DESKBOX_SERVER_SERVICE_PORT": "8765",
             "DESKBOX_SERVER_SERVICE_PORT_HTTP": "8765",
             "DESKBOX_SERVER_PORT": "tcp://10.0.0.7:8765",
             "DESKBOX_SERVER_PORT_8765_TCP": "tcp://10.0.0.7:8765",
             "DESKBOX_SERVER_PORT_8765_TCP_PROTO": "tcp",
             "DESKBOX_SERVER_PORT_8765_TCP_PORT": "8765",
             "DESKBOX_SERVER_PORT_8765_TCP_ADDR": "10.0.0.7"}
    assert unknown_names(links) == []


def test_the_guide_lists_every_setting() -> None:
    guide = (REPO / "docs" / "GUIDE.md").read_text(encoding="utf-8")
    table = guide.split("\n## Settings\n")[1].split("\n## ")[0]
    listed: set[str] = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            listed |= set(re.findall(r"`([A-Z0-9_]+)`", row.split("|")[1]))
    assert listed == SETTINGS, (sorted(SETTINGS - listed), sorted(listed - SETTINGS))
