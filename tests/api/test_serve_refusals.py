"""``deskbox serve`` told something it cannot run with, as an operator meets it: a misspelt
or bad ``DESKBOX_*`` setting, a state dir it cannot write, a port in use, an engine this
host cannot run (not root, no runc, no KVM). Each is one line saying what to change, never
a traceback, and a port in use leaves what a killed server left running as it was."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from deskbox_server.engines.runc.runtime import Runc
from deskbox_server.engines.vm.accel import detect_accelerator
from deskbox_server.errors import Internal

from ..docker.podman import rootless_user
from ..images import IMAGE_STATE_DIR
from ..scratch import scratch_dir
from .served import (
    KEY,
    container_of,
    deskbox_as,
    free_port,
    remove_sandboxes,
    runc_session,
    serve,
)

DESKBOX = str(Path(sys.executable).parent / "deskbox")
LOCAL = {"DESKBOX_BACKENDS": "local", "DESKBOX_DEFAULT_BACKEND": "local"}


def start(state_dir: Path, env: Mapping[str, str], *options: str, port: int | None = None,
          user: pwd.struct_passwd | None = None) -> tuple[int, str]:
    """A ``deskbox serve`` that must end by itself: its exit status and all it said."""
    settings = {"DESKBOX_API_KEYS": KEY, "DESKBOX_IMAGE_STATE_DIR": str(IMAGE_STATE_DIR),
                **env}
    args = ["serve", "--port", str(free_port() if port is None else port),
            "--state-dir", str(state_dir), "--log-format", "text", *options]
    return deskbox(args, settings, user)


def deskbox(args: list[str], settings: Mapping[str, str],
            user: pwd.struct_passwd | None = None) -> tuple[int, str]:
    """``deskbox ARGS`` with only ``settings`` of DESKBOX_*, as root or ``user``, to its
    end: its exit status and all it said."""
    if user is None:
        clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("DESKBOX_")}
        argv, environ = [DESKBOX, *args], {**clean, **settings}
    else:
        argv, environ = deskbox_as(user, args, settings), dict(os.environ)
    ended = subprocess.run(argv, env=environ, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=120, check=False)
    return ended.returncode, ended.stdout + ended.stderr


def one_line(said: str, pattern: str) -> None:
    assert "Traceback" not in said and "╭" not in said, said
    assert len(said.splitlines()) <= 4, said  # uvicorn's own start and stop lines around it
    assert pattern in said, said


@pytest.mark.parametrize(("env", "options", "said"), [
    ({"DESKBOX_MAX_SESSIONS": "abc"}, (),
     "error: DESKBOX_MAX_SESSIONS: Input should be a valid integer"),
    ({"DESKBOX_MAX_SESION": "5"}, (),
     "error: DESKBOX_MAX_SESION is not a setting (did you mean DESKBOX_MAX_SESSIONS?)"),
    ({"deskbox_idle_timeout": "60"}, (),
     "error: deskbox_idle_timeout is not a setting (did you mean DESKBOX_IDLE_TIMEOUT_S?)"),
    ({"DESKBOX_DISPLAY_FIRST": "500", "DESKBOX_DISPLAY_LAST": "300"}, (),
     "error: DESKBOX_DISPLAY_FIRST (500) must be below DESKBOX_DISPLAY_LAST (300)"),
    ({}, ("--host", "nosuchhost.invalid"), "cannot start: cannot listen on 'nosuchhost.invalid'"),
])
def test_a_bad_setting_is_one_line(
    tmp_path: Path, env: dict[str, str], options: tuple[str, ...], said: str,
) -> None:
    """A value pydantic refused was a 40-line traceback of its validation; a misspelt name
    was ignored, and the server ran on the default."""
    status, output = start(tmp_path / "state", {**LOCAL, **env}, *options)
    assert status in (2, 3), output
    one_line(output, said)
    assert not (tmp_path / "state").exists()  # nothing made on the way


def test_a_port_out_of_range_names_the_option(tmp_path: Path) -> None:
    status, output = start(tmp_path / "state", LOCAL, port=70000)
    assert status == 2, output
    one_line(output, "error: --port: Input should be less than or equal to 65535 (got 70000)")


def test_an_unknown_log_level_is_a_usage_error(tmp_path: Path) -> None:
    """Any string was taken, and logging's "Unknown level: 'FOO'" was a traceback."""
    status, output = start(tmp_path / "state", LOCAL, "--log-level", "foo")
    assert status == 2, output
    assert "Traceback" not in output and "Invalid value for '--log-level'" in output, output


@pytest.mark.parametrize(("env", "said"), [
    ({"DESKBOX_BACKENDS": "contianer"}, "cannot start: DESKBOX_BACKENDS: unknown backends "
                                        "contianer (known: container, docker, kubernetes, "
                                        "local, vm)"),
    ({"DESKBOX_BACKENDS": "local"}, "cannot start: DESKBOX_DEFAULT_BACKEND: the default "
                                    "backend 'container' is not among the backends offered"),
    # The pool started Xvfb at 0x0 every 5 s for ever; every create took the cold path.
    ({**LOCAL, "DESKBOX_POOL_SIZE": "1", "DESKBOX_POOL_DISPLAYS": "0x0"},
     "cannot start: DESKBOX_POOL_DISPLAYS: 0x0 is no display a session may have (width: "
     "Input should be greater than or equal to 64"),
])
def test_an_engine_setting_the_server_cannot_run_is_one_line(
    tmp_path: Path, env: dict[str, str], said: str,
) -> None:
    status, output = start(tmp_path / "state", env)
    assert status == 3, output
    one_line(output, said)


@pytest.mark.parametrize("keys", [True, False])
def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path, keys: bool) -> None:
    """Without DESKBOX_API_KEYS the key file is written before start-up, with them the
    state dir's lock at its start: each failed with a traceback (a read-only disk, another
    user's directory, a file in the way)."""
    (tmp_path / "a file").write_text("")
    state_dir = tmp_path / "a file" / "state"
    status, output = start(state_dir, {**LOCAL, **({} if keys else {"DESKBOX_API_KEYS": ""})})
    assert status == 3, output
    one_line(output, f"cannot start: the state dir {state_dir} cannot be used: Not a "
                     "directory (DESKBOX_STATE_DIR or --state-dir)")


def test_the_container_engine_without_root_says_so_before_building(
    request: pytest.FixtureRequest,
) -> None:
    user = rootless_user()
    base = scratch_dir(request, "deskbox-refusal-")
    os.chown(base, user.pw_uid, user.pw_gid)
    # An empty image cache of its own: the engine must refuse before the image's build.
    status, output = start(base / "state", {"DESKBOX_IMAGE_STATE_DIR": str(base / "images")},
                           user=user)
    assert status == 3, output
    one_line(output, "cannot start: the container engine needs root")
    assert not (base / "images").exists()


def test_the_container_engine_without_runc_says_so(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    status, output = start(tmp_path / "state", {"PATH": str(tmp_path / "bin")})
    assert status == 3, output
    one_line(output, "cannot start: the container engine needs runc (Debian's runc")


def test_an_image_cache_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    """The image build's traceback through pathlib's mkdir, twice (relayed line by line,
    then as the reason)."""
    (tmp_path / "a file").write_text("")
    cache = tmp_path / "a file" / "cache"
    status, output = start(tmp_path / "state", {"DESKBOX_IMAGE_STATE_DIR": str(cache)})
    assert status == 3, output
    assert "Traceback" not in output, output
    assert (f"cannot start: the image cache {cache}/images cannot be made: Not a directory "
            "(DESKBOX_IMAGE_STATE_DIR, or deskbox image --state-dir)") in output, output


def test_an_image_cache_another_user_owns_is_said(request: pytest.FixtureRequest) -> None:
    """``deskbox image build`` by a user who may read the cache but not write it ended on
    the build's traceback (PermissionError on its lock file). The build script still
    writes it (a change of the script would change every image's recipe hash), but the
    last word says what is wrong."""
    user = rootless_user()
    base = scratch_dir(request, "deskbox-refusal-")
    base.chmod(0o755)
    (base / "cache" / "images").mkdir(parents=True)  # root's, 0755
    status, output = deskbox(["image", "build", "--state-dir", str(base / "cache")], {},
                             user=user)
    assert status == 2, output
    assert output.splitlines()[-1] == (
        f"error: the image cache {base}/cache/images cannot be written, and this image is "
        "not built there (DESKBOX_IMAGE_STATE_DIR, or deskbox image --state-dir)"), output


def test_kvm_asked_for_where_there_is_none(tmp_path: Path) -> None:
    """A ValueError out of the vm engine's prepare: uvicorn's traceback."""
    with pytest.raises(Internal, match=r"^DESKBOX_VM_ACCELERATOR=kvm, but .*nokvm cannot be "
                                       r"opened \(No such file or directory\)"):
        detect_accelerator("kvm", kvm_device=tmp_path / "nokvm")


@pytest.mark.slow
def test_a_port_in_use_leaves_what_a_killed_server_left_running(tmp_path: Path) -> None:
    """uvicorn bound its port after the app's start-up: a server restarted on a port in
    use re-adopted the killed server's sessions, failed to bind, and stopped every one of
    them on its way out."""
    state_dir, log = tmp_path / "state", tmp_path / "server.log"
    inits: list[int] = []
    try:
        with serve(state_dir, log) as (first, http):
            session_id, init = runc_session(http)
            inits.append(init)
            container = container_of(session_id)
            first.send_signal(signal.SIGKILL)
            first.wait()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            status, output = start(state_dir, {}, port=port)
        assert status == 3, output
        assert Runc().state(container) is not None, output
        one_line(output, f"cannot start: cannot listen on 127.0.0.1:{port}: Address already "
                         "in use")
        with serve(state_dir, log) as (_, http):
            again = http.get(f"/v1/sessions/{session_id}").json()
            assert again["state"] == "running", again
            assert http.delete(f"/v1/sessions/{session_id}").status_code == 204
    finally:
        remove_sandboxes(state_dir, inits)
