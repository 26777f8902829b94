"""Persistent volumes and browser profiles end to end: a real server, real runc sandboxes,
real ext4 disk images mounted into them, real HTTP, and the browser's real profile.

What a user sees: files written in one session are there in the next one; a volume has one
writer or readers only (409 otherwise); a full volume is ENOSPC for the program and nothing
else; a browser profile keeps a cookie from one session to the next; copies of a session
with volumes are refused; a hibernated session keeps its volume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deskbox import Deskbox, cdp
from deskbox_server.api.auth import key_id
from deskbox_server.settings import Settings

from ..images import IMAGE_STATE_DIR, session_image
from .conftest import DISPLAY, KEY_A, KEY_B, Server, running_server
from .helpers import assert_error

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORK = "/root/work"


@pytest.fixture(scope="module")
def volume_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    session_image()
    settings = Settings(
        state_dir=tmp_path_factory.mktemp("volumes-state"), api_keys=[KEY_A, KEY_B],
        image_state_dir=IMAGE_STATE_DIR, reaper_interval_s=0.5, max_sessions_per_key=6,
        volume_quota_mb=4096,
    )
    with running_server(settings) as running:
        yield running


@pytest.fixture
def client(volume_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=volume_server.url, timeout=120,
                      headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        yield http
        # Each test leaves no session and no volume behind.
        for session in http.get("/v1/sessions").json()["sessions"]:
            http.delete(f"/v1/sessions/{session['id']}")
        for volume in http.get("/v1/volumes").json()["volumes"]:
            assert http.delete(f"/v1/volumes/{volume['name']}").status_code == 204


def make_volume(client: httpx.Client, name: str, size_mb: int = 64) -> dict[str, Any]:
    response = client.post("/v1/volumes", json={"name": name, "size_mb": size_mb})
    assert response.status_code == 201, response.text
    volume: dict[str, Any] = response.json()
    return volume


def start(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/sessions", json={"display": DISPLAY, **body})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


def run(client: httpx.Client, session: dict[str, Any], script: str) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{session['id']}/exec",
                           json={"cmd": ["sh", "-c", script], "timeout_s": 60})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def delete(client: httpx.Client, session: dict[str, Any]) -> None:
    assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204


def test_volumes_are_the_keys_own_and_bad_input_is_a_clear_4xx(
    client: httpx.Client, volume_server: Server
) -> None:
    volume = make_volume(client, "work", 32)
    assert (volume["name"], volume["size_mb"], volume["attached"]) == ("work", 32, [])
    assert_error(client.post("/v1/volumes", json={"name": "work", "size_mb": 32}),
                 409, "conflict")
    assert [v["name"] for v in client.get("/v1/volumes").json()["volumes"]] == ["work"]
    assert client.get("/v1/volumes/work").json()["size_mb"] == 32
    for bad in ({"name": "Work", "size_mb": 32}, {"name": "../x", "size_mb": 32},
                {"name": "work2", "size_mb": 1}, {"name": "work2"}, {"name": "w", "size_mb": "9"},
                {"name": "w", "size_mb": 32, "extra": 1}):
        assert_error(client.post("/v1/volumes", json=bad), 422, "invalid_request")
    over = client.post("/v1/volumes", json={"name": "huge", "size_mb": 8192})
    assert_error(over, 429, "quota_exceeded")  # over this server's quota per key
    assert "retry-after" not in over.headers  # waiting frees nothing
    assert_error(client.get("/v1/volumes/nothing"), 404, "not_found")
    assert_error(client.get("/v1/volumes/.."), 404, "not_found")
    with httpx.Client(base_url=volume_server.url,
                      headers={"Authorization": f"Bearer {KEY_B}"}) as other:
        assert other.get("/v1/volumes").json()["volumes"] == []
        assert_error(other.get("/v1/volumes/work"), 404, "not_found")
        assert_error(other.delete("/v1/volumes/work"), 404, "not_found")
        assert_error(other.post("/v1/sessions", json={
            "volumes": [{"name": "work", "path": WORK}]}), 404, "not_found")
    for mounts in ([{"name": "work", "path": "/etc/work"}],
                   [{"name": "work", "path": "/root/../etc"}],
                   [{"name": "work", "path": "/tmp/.X11-unix/x"}],
                   [{"name": "work", "path": WORK}, {"name": "work", "path": "/tmp/w"}],
                   [{"name": "work", "path": "/root/chromium/x"}]):
        response = client.post("/v1/sessions", json={
            "volumes": mounts, "browser": {"profile": "p"}})
        assert_error(response, 422, "invalid_request")
    assert client.get("/v1/volumes").json()["volumes"][0]["attached"] == []
    assert client.get("/v1/sessions").json()["sessions"] == []


def test_files_outlive_the_session_and_move_between_user_namespaces(
    client: httpx.Client,
) -> None:
    """Written in a sandbox with a user namespace (egress none), appended to by one without
    (egress all: the host's root, no capabilities), read again in the first kind."""
    make_volume(client, "work")
    first = start(client, volumes=[{"name": "work", "path": WORK}])
    assert first["volumes"] == [{"name": "work", "path": WORK, "read_only": False}]
    assert run(client, first, f"echo one > {WORK}/note")["exit_code"] == 0
    delete(client, first)
    second = start(client, volumes=[{"name": "work", "path": WORK}],
                   network={"egress": "all"})
    result = run(client, second, f"echo two >> {WORK}/note && cat {WORK}/note")
    assert (result["exit_code"], result["stdout"]) == (0, "one\ntwo\n"), result
    delete(client, second)
    third = start(client, volumes=[{"name": "work", "path": WORK, "read_only": True}])
    assert run(client, third, f"cat {WORK}/note")["stdout"] == "one\ntwo\n"
    refused = run(client, third, f"echo three >> {WORK}/note")
    assert refused["exit_code"] != 0 and "Read-only file system" in refused["stderr"]
    delete(client, third)
    assert client.get("/v1/volumes/work").json()["used_bytes"] > 0


def test_a_background_command_hears_the_stop_and_finishes_its_writes(
    client: httpx.Client,
) -> None:
    """A session's end gives every process of it SIGTERM and a moment, not only the
    desktop's own: a command left running in the background was killed without warning,
    and its last write never reached the volume."""
    make_volume(client, "work")
    first = start(client, volumes=[{"name": "work", "path": WORK}])
    writer = (f"trap 'echo finished > {WORK}/last; exit 0' TERM; echo started > {WORK}/last;"
              " while :; do sleep 0.1; done")
    started = run(client, first, f"setsid sh -c \"{writer}\" </dev/null >/dev/null 2>&1 &"
                  f" sleep 0.5; cat {WORK}/last")
    assert started["stdout"] == "started\n", started
    delete(client, first)
    second = start(client, volumes=[{"name": "work", "path": WORK}])
    assert run(client, second, f"cat {WORK}/last")["stdout"] == "finished\n"
    delete(client, second)


def test_a_volume_has_one_writer_or_readers_only(client: httpx.Client) -> None:
    make_volume(client, "shared")
    writer = start(client, volumes=[{"name": "shared", "path": WORK}])
    attached = client.get("/v1/volumes/shared").json()["attached"]
    assert attached == [{"session_id": writer["id"], "read_only": False}]
    for read_only in (False, True):
        error = assert_error(client.post("/v1/sessions", json={
            "volumes": [{"name": "shared", "path": WORK, "read_only": read_only}]}),
            409, "conflict")
        assert writer["id"] in error["message"]
    assert_error(client.delete("/v1/volumes/shared"), 409, "conflict")
    delete(client, writer)
    readers = [start(client, volumes=[{"name": "shared", "path": "/tmp/shared",
                                       "read_only": True}]) for _ in range(2)]
    assert len(client.get("/v1/volumes/shared").json()["attached"]) == 2
    assert_error(client.post("/v1/sessions", json={
        "volumes": [{"name": "shared", "path": WORK}]}), 409, "conflict")
    for reader in readers:
        assert run(client, reader, "ls /tmp/shared")["exit_code"] == 0
        delete(client, reader)
    assert client.get("/v1/volumes/shared").json()["attached"] == []


def test_a_full_volume_is_enospc_for_the_program_only(client: httpx.Client) -> None:
    make_volume(client, "small", 16)
    session = start(client, volumes=[{"name": "small", "path": WORK}])
    full = run(client, session, f"dd if=/dev/zero of={WORK}/fill bs=1M count=64")
    assert full["exit_code"] != 0 and "No space left on device" in full["stderr"], full
    # The session and the server carry on.
    shot = client.post(f"/v1/sessions/{session['id']}/actions", json={
        "actions": [{"type": "wait", "ms": 0}], "screenshot": {"format": "png"}})
    assert shot.status_code == 200 and shot.json()["screenshot"]["data_b64"]
    assert run(client, session, "echo ok > /tmp/ok && cat /tmp/ok")["stdout"] == "ok\n"
    assert client.get("/healthz").status_code == 200
    delete(client, session)


COOKIE_PAGE = ("<script>document.cookie = 'signed_in=yes; max-age=86400; path=/';"
               "document.title = 'set';</script>")


def serve_site(client: httpx.Client, session: dict[str, Any]) -> None:
    """A web server on the sandbox's own loopback (egress none: nothing else to reach)."""
    assert run(client, session, "mkdir -p /tmp/site && printf %s \"$PAGE\" > /tmp/site/set.html"
               .replace("$PAGE", COOKIE_PAGE.replace('"', '\\"')))["exit_code"] == 0
    response = client.post(f"/v1/sessions/{session['id']}/exec", json={
        "cmd": ["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1",
                "--directory", "/tmp/site"], "background": True})
    assert response.status_code == 200, response.text
    assert run(client, session, "for i in $(seq 50); do python3 -c \"import urllib.request;"
               "urllib.request.urlopen('http://127.0.0.1:8000/')\" 2>/dev/null && exit 0;"
               " sleep 0.1; done; exit 1")["exit_code"] == 0


def test_a_browser_profile_keeps_a_cookie_to_the_next_session(
    client: httpx.Client, volume_server: Server
) -> None:
    with Deskbox(volume_server.url, KEY_A) as box:
        first = start(client, browser={"profile": "me"})
        assert first["browser"]["profile"] == "me"
        assert client.get("/v1/volumes/me").json()["size_mb"] == 1024  # made on first use
        serve_site(client, first)
        session = box.sessions.get(first["id"])
        cdp.navigate(session, "http://127.0.0.1:8000/set.html")
        assert "signed_in=yes" in cdp.evaluate(session, "document.cookie")
        delete(client, first)  # the browser is stopped, not killed: its cookies are written
        assert client.get("/v1/volumes/me").json()["attached"] == []

        second = start(client, browser={"profile": "me"})
        serve_site(client, second)
        session = box.sessions.get(second["id"])
        cdp.navigate(session, "http://127.0.0.1:8000/")
        assert "signed_in=yes" in cdp.evaluate(session, "document.cookie")
        error = assert_error(client.post("/v1/sessions", json={"browser": {"profile": "me"}}),
                             409, "conflict")
        assert second["id"] in error["message"]
        delete(client, second)

        third = start(client)  # no profile: a fresh browser
        serve_site(client, third)
        session = box.sessions.get(third["id"])
        cdp.navigate(session, "http://127.0.0.1:8000/")
        assert cdp.evaluate(session, "document.cookie") == ""
        delete(client, third)


def test_a_volume_whose_record_was_cut_keeps_its_disk(
    client: httpx.Client, volume_server: Server
) -> None:
    """A power loss can leave a volume's record empty (its write not on the disk yet). It
    then read as no volume at all: a browser profile's next session made the volume anew,
    removing its disk image and what the user kept in it, and the listing and the quota
    left it out. Now the record is made again from the disk image."""
    first = start(client, browser={"profile": "kept"})
    assert run(client, first, "echo mine > /root/chromium/note")["exit_code"] == 0
    delete(client, first)
    record = (volume_server.settings.state_dir / "volumes" / key_id(KEY_A) / "kept"
              / "volume.json")
    record.write_text("")
    listed = client.get("/v1/volumes").json()["volumes"]
    assert [(v["name"], v["size_mb"]) for v in listed] == [("kept", 1024)], listed
    second = start(client, browser={"profile": "kept"})
    assert run(client, second, "cat /root/chromium/note")["stdout"] == "mine\n"
    delete(client, second)
    assert '"size_mb":1024' in record.read_text()  # written again, whole


def test_copies_of_a_session_with_volumes_are_refused(client: httpx.Client) -> None:
    make_volume(client, "work")
    session = start(client, volumes=[{"name": "work", "path": WORK}])
    for path in ("snapshots", "fork"):
        error = assert_error(client.post(f"/v1/sessions/{session['id']}/{path}"),
                             422, "invalid_request")
        assert "volumes" in error["message"]
    delete(client, session)


def test_a_hibernated_session_keeps_its_volume(client: httpx.Client) -> None:
    make_volume(client, "work")
    session = start(client, volumes=[{"name": "work", "path": WORK}])
    assert run(client, session, f"echo before > {WORK}/note")["exit_code"] == 0
    paused = client.post(f"/v1/sessions/{session['id']}/pause", json={"mode": "hibernate"})
    assert paused.status_code == 200 and paused.json()["state"] == "hibernated", paused.text
    attached = client.get("/v1/volumes/work").json()["attached"]
    assert attached == [{"session_id": session["id"], "read_only": False}]
    assert_error(client.post("/v1/sessions", json={
        "volumes": [{"name": "work", "path": WORK}]}), 409, "conflict")
    resumed = client.post(f"/v1/sessions/{session['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "running", resumed.text
    result = run(client, session, f"echo after >> {WORK}/note && cat {WORK}/note")
    assert result["stdout"] == "before\nafter\n", result
    delete(client, session)


def test_an_engine_without_volumes_refuses_them(server: Server) -> None:
    """The local engine (host processes, no sandbox) cannot mount anything."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        error = assert_error(http.post("/v1/sessions", json={
            "volumes": [{"name": "work", "path": WORK}]}), 422, "invalid_request")
        assert "volumes" in error["message"] and "local" in error["message"]
        assert "the container, vm and kubernetes backends have it" in error["message"]
        assert http.get("/v1/volumes").json()["volumes"] == []


def test_the_sdk_makes_lists_mounts_and_deletes_volumes(volume_server: Server) -> None:
    with Deskbox(volume_server.url, KEY_A) as box:
        volume = box.volumes.create("sdk", 16)
        assert (volume.name, volume.raw["size_mb"]) == ("sdk", 16)
        assert [v.name for v in box.volumes.list()] == ["sdk"]
        session = box.sessions.create(volumes=[{"name": "sdk", "path": "/tmp/sdk"}],
                                      profile="sdk-profile")
        try:
            assert session.data.raw["volumes"][0]["path"] == "/tmp/sdk"
            attached = box.volumes.get("sdk").raw["attached"]
            assert attached == [{"session_id": session.id, "read_only": False}]
            assert box.volumes.get("sdk-profile").raw["attached"][0]["session_id"] == session.id
        finally:
            session.close()
        for name in ("sdk", "sdk-profile"):
            box.volumes.delete(name)
        assert box.volumes.list() == []


def test_a_hibernated_session_keeps_its_volume_across_a_server_restart(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The server stops (the hibernated session stays on disk, its disk unmounted) and a new
    one on the same state dir takes it over: the volume is attached again and mounted again
    when the session resumes."""
    settings = Settings(state_dir=tmp_path_factory.mktemp("volumes-restart"),
                        api_keys=[KEY_A], image_state_dir=IMAGE_STATE_DIR)
    with running_server(settings) as first, httpx.Client(
            base_url=first.url, timeout=120,
            headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        make_volume(http, "work")
        session = start(http, volumes=[{"name": "work", "path": WORK}])
        assert run(http, session, f"echo kept > {WORK}/note")["exit_code"] == 0
        paused = http.post(f"/v1/sessions/{session['id']}/pause", json={"mode": "hibernate"})
        assert paused.status_code == 200, paused.text
    with running_server(settings) as second, httpx.Client(
            base_url=second.url, timeout=120,
            headers={"Authorization": f"Bearer {KEY_A}"}) as http:
        attached = http.get("/v1/volumes/work").json()["attached"]
        assert attached == [{"session_id": session["id"], "read_only": False}]
        assert_error(http.post("/v1/sessions", json={
            "volumes": [{"name": "work", "path": WORK}]}), 409, "conflict")
        resumed = http.post(f"/v1/sessions/{session['id']}/resume")
        assert resumed.status_code == 200, resumed.text
        assert run(http, session, f"cat {WORK}/note")["stdout"] == "kept\n"
        delete(http, session)
        assert http.get("/v1/volumes/work").json()["attached"] == []
        assert http.delete("/v1/volumes/work").status_code == 204


def test_the_readme_example(volume_server: Server, tmp_path: Path) -> None:
    """README "Persistent volumes and profiles", pasted: its file is in the volume after."""
    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    [code] = [block for block in re.findall(r"^```python\n(.*?)^```", text,
                                            re.MULTILINE | re.DOTALL)
              if "box.volumes.create" in block]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DESKBOX_")}
    env |= {"DESKBOX_URL": volume_server.url, "DESKBOX_API_KEY": KEY_A}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    with Deskbox(volume_server.url, KEY_A) as box:
        assert {v.name for v in box.volumes.list()} == {"work", "alice"}
        with box.sessions.create(volumes=[{"name": "work", "path": WORK,
                                           "read_only": True}]) as session:
            assert session.exec(["cat", f"{WORK}/first-seen"]).stdout.strip()
        for name in ("work", "alice"):
            box.volumes.delete(name)


def test_a_volume_that_does_not_mount_fails_only_that_create(
    client: httpx.Client, volume_server: Server
) -> None:
    """A disk image that is no file system (here its superblock wiped) fails the create
    with a message naming the volume; nothing stays mounted and the volume is free."""
    make_volume(client, "broken", 16)
    [disk] = Path(volume_server.settings.state_dir).glob("volumes/*/broken/disk.ext4")
    with disk.open("r+b") as image:
        image.write(b"\0" * 8192)
    response = client.post("/v1/sessions", json={
        "volumes": [{"name": "broken", "path": WORK}]})
    error = assert_error(response, 502, "session_failed")
    assert "broken" in error["message"]
    assert client.get("/v1/volumes/broken").json()["attached"] == []
    assert str(disk) not in Path("/proc/self/mountinfo").read_text()
    assert subprocess.run(["losetup", "-j", str(disk)], capture_output=True,
                          text=True).stdout == ""


def test_a_delete_cut_short_leaves_no_volume_behind(
    client: httpx.Client, volume_server: Server,
) -> None:
    """A delete that could not remove all its files (here the disk image made immutable;
    a killed server alike) removed them in the directory's order: the disk image could
    go and the record stay, and the volume came back, unmountable and counted against the
    key's quota. Now its record goes first: the volume is gone, whatever is left."""
    make_volume(client, "cut")
    disk = volume_server.settings.state_dir / "volumes" / key_id(KEY_A) / "cut" / "disk.ext4"
    subprocess.run(["chattr", "+i", disk], check=True)
    try:
        assert client.delete("/v1/volumes/cut").status_code == 204
        assert_error(client.get("/v1/volumes/cut"), 404, "not_found")
        assert "cut" not in [v["name"] for v in client.get("/v1/volumes").json()["volumes"]]
    finally:
        subprocess.run(["chattr", "-i", disk], check=False)
    make_volume(client, "cut")  # its name is free again: the leftovers go then
