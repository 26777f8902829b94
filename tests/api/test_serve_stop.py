"""``deskbox serve`` as a process: told twice to stop, as a person does who presses Ctrl-C
again while it stops (uvicorn then skips the app's shutdown, its forced exit, which would
leave every session's sandbox running after the server); started from a shell whose limit
on open files is the usual 1024."""

from __future__ import annotations

import resource
import signal
import time
from pathlib import Path

import pytest

from deskbox_server.app import runc_engine
from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.runc.sandbox import remove_orphans
from deskbox_server.scratch import Scratch, scratch_prefix
from deskbox_server.settings import Settings

from .served import serve
from .test_container import mounts_mentioning

pytestmark = pytest.mark.slow
SCRATCH = Path("/dev/shm")  # the server's default scratch_dir
SCRATCH_PURPOSES = ("images", "fork")


def test_ctrl_c_twice_still_stops_every_session(tmp_path: Path) -> None:
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    runc = Runc()
    try:
        with serve(state_dir, log) as (process, http):
            created = http.post("/v1/sessions", json={})
            assert created.status_code == 201, created.text
            session_id = created.json()["id"]
            [container] = [c for c in runc.list_ids() if c.endswith("-" + session_id)]
            assert runc.state(container) is not None
            process.send_signal(signal.SIGINT)
            time.sleep(0.05)  # uvicorn's shutdown has not reached the app's yet
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=60) == 0
        text = log.read_text()
        assert f"session {session_id} stopped" in text and "deskbox stopped every session" in text
        assert "Traceback" not in text
        assert runc.state(container) is None
        assert not list((state_dir / "sessions").iterdir())
        assert not mounts_mentioning(str(state_dir))
        for purpose in SCRATCH_PURPOSES:
            prefix = scratch_prefix(state_dir, purpose)
            assert not [p for p in SCRATCH.iterdir() if p.name.startswith(prefix)]
    finally:
        # Whatever happened above: nothing of this state dir outlives the test.
        remove_orphans(runc_engine(Settings(state_dir=state_dir)).options, keep=())
        for purpose in SCRATCH_PURPOSES:
            Scratch(SCRATCH, state_dir, purpose).open(needed=False)


def test_serve_raises_a_low_limit_on_open_files(tmp_path: Path) -> None:
    """A shell's soft limit is often 1024 (systemd's default: 1024 of 524288), which a
    server of a few hundred sessions and their clients would run out of."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    assert expected > 1024, f"the hard limit on open files here is {hard}"
    with serve(tmp_path / "state", tmp_path / "server.log", open_files=1024) as (process, _):
        [line] = [line for line in Path(f"/proc/{process.pid}/limits").read_text().splitlines()
                  if line.startswith("Max open files")]
        assert line.split()[3] == str(expected), line
