"""The docker engine's sweep of orphans at a server's start, against a daemon that refuses to
remove one container (a daemon error, or a container it holds on to): the sweep logs that
one and removes the rest, and the server starts. The refusal escaped before, and stopped
every start, since the next start listed the same container again. The daemon here is our
own client's class with its answers held at a seam; everything else is the engine's."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from deskbox_server.engines.docker.daemon import Daemon, DaemonRefused
from deskbox_server.engines.docker.engine import DockerEngine, DockerOptions
from deskbox_server.engines.docker.spec import LABEL_SERVER, LABEL_SESSION


class _RefusesOne(Daemon):
    """Lists this server's containers ``containers`` (id → session) and removes every one
    but ``refused``, which it answers with a 500 as a daemon would."""

    def __init__(self, tag: str, containers: dict[str, str], refused: str) -> None:
        super().__init__("unix:///nonexistent")
        self.tag, self.containers, self.refused = tag, containers, refused

    async def list_labelled(self, label: str) -> list[dict[str, Any]]:
        assert label == f"{LABEL_SERVER}={self.tag}"
        return [{"Id": cid, "Labels": {LABEL_SESSION: sid, LABEL_SERVER: self.tag}}
                for cid, sid in self.containers.items()]

    async def remove(self, container: str) -> None:
        if container == self.refused:
            raise DaemonRefused("remove a container", 500, "container is busy")
        del self.containers[container]


def test_an_orphan_the_daemon_will_not_remove_is_logged_and_the_sweep_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = DockerEngine(DockerOptions(url="unix:///nonexistent", state_dir=tmp_path))
    daemon = engine.daemon = _RefusesOne(
        engine.tag, {"c-stuck": "ses_a_stuck", "c-gone": "ses_b_gone"}, refused="c-stuck")
    for session_id in ("ses_a_stuck", "ses_b_gone"):
        (tmp_path / "docker" / session_id).mkdir(parents=True)

    with caplog.at_level(logging.WARNING, logger="deskbox.docker"):
        assert asyncio.run(engine.remove_orphans(())) == ["ses_b_gone"]
    assert list(daemon.containers) == ["c-stuck"]
    # Its socket directory stays with it, for the next start's sweep.
    assert [p.name for p in (tmp_path / "docker").iterdir()] == ["ses_a_stuck"]
    (warning,) = [r.getMessage() for r in caplog.records if "ses_a_stuck" in r.getMessage()]
    assert "not removed" in warning and "container is busy" in warning
