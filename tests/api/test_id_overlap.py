"""The runc engine says when a user of the host may become its sandboxes' ids: Debian's
useradd gives the first ordinary user 100000-165535, the sandboxes' own range."""

from __future__ import annotations

from pathlib import Path

from deskbox_server.engines.runc.id_overlap import users_sharing_ids
from deskbox_server.engines.runc.layout import SANDBOX_USER_IDS


def test_users_whose_subordinate_ids_overlap_the_sandboxes_are_named(tmp_path: Path) -> None:
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    first, count = SANDBOX_USER_IDS
    subuid.write_text(f"alice:{first}:65536\nbob:{first + count}:65536\nbroken line\n")
    subgid.write_text(f"carol:{first - 10}:11\ndave:{first - 10}:10\n")
    assert users_sharing_ids(SANDBOX_USER_IDS, (subuid, subgid)) == [
        f"alice ({subuid}: {first}-{first + 65535})",
        f"carol ({subgid}: {first - 10}-{first})",
    ]
    assert users_sharing_ids(SANDBOX_USER_IDS, (tmp_path / "missing",)) == []
