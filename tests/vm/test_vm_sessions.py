"""The vm engine end to end: a server whose sessions are QEMU microVMs (TCG here).

A VM costs a minute of CPU to boot under software emulation, so one VM (conftest.py's
``vm.session``) serves the module, in order: a create below the engine's ``cpus`` floor
refused before anything boots; its page, input, screenshot and exec; live
view, CDP, files and clipboard; its server killed outright and a new one adopting the VM
that ran on; pause and resume; hibernate and resume; a fork into two independent copies; a
snapshot's copy at its own ``cpus`` (and a 422 for resources a restored VM cannot change);
and last, delete, which must leave no QEMU, file or cgroup.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import sync_playwright

from deskbox import Deskbox
from deskbox_server.engines.vm.cgroup import CGROUP_ROOT, VmCgroup
from deskbox_server.engines.vm.qemu import VmConfig
from deskbox_server.engines.vm.sandbox import CONFIG_FILE, HIBERNATION_FILE, runtime_root

from ..api.containers import act
from ..api.helpers import assert_error, decode, token_for
from ..api.sandbox_page import SandboxPage
from ..api.served import KEY
from ..api.test_container import running as alive
from ..api.test_dialects import block_image, claude, gpt, output_image
from ..rfb_client import RfbViewer
from .conftest import Vm, VmServers, qemu_pids, quota_us, status_field

# A VM boots in a minute of TCG on 2 busy cores; a module fixture's start counts toward
# the first test that uses it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)
PAGE_WAIT_S = 120.0  # a read of the page runs a Python program inside the guest, under TCG
TEXT = "VM ✓ö wörld"  # Unicode, two characters without a key in a row
SESSION_QUOTA_US = 100_000  # resources.cpus 1.0 (the default), once the desktop is ready


@pytest.fixture
def client(vm: Vm) -> httpx.Client:
    return vm.client  # the server of the moment: test_a_killed_server... starts another


@pytest.fixture(scope="module")
def session(vm: Vm) -> dict[str, Any]:
    return vm.session


def read_page(client: httpx.Client, session_id: str, predicate: Any) -> dict[str, Any]:
    """The first state of the event page ``predicate`` accepts, from its title (the page
    mirrors what it received there) as the session's DevTools listing gives it: through the
    guest's agent, with no program to start in the guest (seconds each under TCG)."""
    deadline = time.monotonic() + PAGE_WAIT_S
    while True:
        listing = client.get(f"/v1/sessions/{session_id}/cdp/json/list")
        assert listing.status_code == 200, listing.text
        # DevTools gives the title HTML-escaped.
        titles = [html.unescape(t["title"]) for t in listing.json() if t["type"] == "page"]
        state: dict[str, Any] | None = None
        for title in titles:
            with contextlib.suppress(ValueError):
                state = json.loads(title[title.index("{"): title.rindex("}") + 1])
        if state is not None and predicate(state):
            return state
        assert time.monotonic() < deadline, f"the page never got there: {titles}"
        # Not faster: each listing costs the emulated guest's Chromium CPU that its page
        # needs too.
        time.sleep(1.0)


@pytest.fixture(scope="module")
def origin(vm: Vm) -> tuple[int, int]:
    read_page(vm.client, vm.id, lambda state: state["clicks"] == 0)
    act(vm.client, vm.session, {"type": "click", "x": 640, "y": 700})
    click = read_page(vm.client, vm.id, lambda state: state["clicks"] >= 1)["click"]
    # The X-side reader of the container tests, once: the title seen inside the guest.
    with SandboxPage(vm.client, vm.id, PAGE_WAIT_S) as page:
        assert page.wait(lambda state: True, timeout_s=PAGE_WAIT_S)["click"] == click
    return click[2] - click[0], click[3] - click[1]


def test_healthz_names_the_accelerator(client: httpx.Client) -> None:
    engines = client.get("/healthz").json()["engines"]
    vm = engines["vm"]
    assert vm["details"]["accelerator"] == "tcg"  # this host's /dev/kvm is kvm-pvm
    assert "kvm-pvm" in vm["details"]["accelerator_reason"]
    assert vm["details"]["least_cpus"] == "0.25"  # the TCG floor a create below gets a 422 for
    assert vm["capabilities"] == ["adopt", "checkpoint", "exec", "freeze", "resources",
                                  "volumes"]
    assert vm["egress"] == ["all", "allowlist", "none"]
    assert "adopt" in engines["container"]["capabilities"]


def test_a_create_below_the_tcg_cpus_floor_is_refused_before_anything_boots(
    servers: VmServers,
) -> None:
    """Under TCG a screenshot took about 1 s at cpus 0.1 (its first 2.8 s) and 9-19 s at
    0.03, near a call's timeout, which fails the session: the vm engine takes 0.25 at
    least here. The refusal comes before QEMU starts (a boot takes minutes; 10 s is
    plenty for the answer), and leaves no session, directory or cgroup behind."""
    vm = servers.vm  # the package's VMs need not be running: nothing here touches them
    before = _session_ids(vm.client)
    refused = vm.client.post("/v1/sessions", json={"resources": {"cpus": 0.1}}, timeout=10)
    message = assert_error(refused, 422, "invalid_request")["message"]
    assert message.startswith(
        "resources.cpus 0.1 is below 0.25, the least the vm engine takes on this host: "
        "its VMs run under software emulation (TCG)"), message
    _assert_nothing_made(vm, before)


def _assert_nothing_made(vm: Vm, before: set[str]) -> None:
    """No session, VM directory or cgroup beside those of the sessions ``before``."""
    assert _session_ids(vm.client) == before
    for parent in (vm.state_dir / "vm", runtime_root(vm.state_dir)):
        made = {e.name for e in parent.iterdir() if e.is_dir()} if parent.is_dir() else set()
        assert made <= before, parent
    cgroups = CGROUP_ROOT / "cpu" if VmCgroup("").v1 else CGROUP_ROOT
    prefix = f"deskbox-vm-{runtime_root(vm.state_dir).name}-"
    assert {p.name.removeprefix(prefix) for p in cgroups.glob(f"{prefix}*")} <= before


def _session_ids(client: httpx.Client) -> set[str]:
    """Every session of the key, in any state (the package's are fewer than a page)."""
    listed = client.get("/v1/sessions", params={"limit": 1000})
    assert listed.status_code == 200, listed.text
    return {s["id"] for s in listed.json()["sessions"]}


def test_a_vm_session_runs_its_own_kernel(
    client: httpx.Client, session: dict[str, Any], vm: Vm
) -> None:
    assert session["backend"] == "vm" and session["state"] == "running"
    assert session["engine"]["accelerator"] == "tcg"
    assert vm.qemu()
    response = client.post(f"/v1/sessions/{session['id']}/exec", json={
        "cmd": ["sh", "-c", "uname -r; cat /proc/1/cmdline | tr '\\0' ' '; echo; "
                    "ls /sys/class/net; cat /proc/meminfo | head -1"],
    })
    assert response.status_code == 200, response.text
    lines = response.json()["stdout"].splitlines()
    assert lines[0] != Path("/proc/sys/kernel/osrelease").read_text().strip()  # not the host's
    assert "deskbox-session" in lines[1]
    assert lines[2:-1] == ["lo"]  # egress none: no network device at all
    mem_kib = int(lines[-1].split()[1])
    assert 1_500_000 < mem_kib <= 2048 * 1024  # the default 2048 MiB of guest RAM
    # Under TCG the agent waits longer on the guest's Chromium (keymap re-reads, typing).
    agent = client.post(f"/v1/sessions/{session['id']}/exec", json={
        "cmd": ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
                " | grep '[d]eskbox-agent --listen'"]}).json()
    assert agent["stdout"].split()[-2:] == ["--patience", "10"], agent


def test_qemu_runs_jailed(vm: Vm) -> None:
    """As Firecracker's jailer would have it: its own user, no capability, own namespaces
    and cgroups, and no host file but its own and the guest's."""
    qemu = vm.qemu()
    uid = status_field(qemu, "Uid").split()
    assert len(set(uid)) == 1 and int(uid[0]) >= 1_000_000  # real, effective, saved, fs
    assert status_field(qemu, "CapEff") == "0" * 16 and status_field(qemu, "NoNewPrivs") == "1"
    assert int(status_field(qemu, "Seccomp")) == 2  # QEMU's own -sandbox on
    for namespace in ("mnt", "pid", "net"):
        assert os.readlink(f"/proc/{qemu}/ns/{namespace}") != os.readlink(
            f"/proc/self/ns/{namespace}")
    root = Path(f"/proc/{qemu}/root")
    assert not (root / "root").exists() and not (root / "home").exists()
    assert not (root / "etc" / "passwd").exists()
    assert (root / str(vm.paths().runtime).lstrip("/") / "qmp.sock").exists()
    cgroups = Path(f"/proc/{qemu}/cgroup").read_text()
    assert f"cpu:/{vm.cgroup().name}" in cgroups
    assert f"memory:/{vm.cgroup().name}" in cgroups
    limit = int((Path("/sys/fs/cgroup/memory") / vm.cgroup().name /
                 "memory.limit_in_bytes").read_text())
    assert limit == (2048 + 384) << 20  # the guest's RAM and QEMU's own headroom
    assert quota_us(vm.cgroup()) == SESSION_QUOTA_US  # booted without it, then given it


def test_clicks_and_typing_land_in_the_page(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    act(client, session, {"actions": [
        {"type": "click", "x": ox + 150, "y": oy + 150},
        {"type": "click", "x": ox + 900, "y": oy + 175},
        {"type": "type", "text": TEXT},
    ]})
    state = read_page(client, session["id"], lambda s: s["value"] == TEXT)
    assert state["clicks"] >= 3 and state["value"] == TEXT


def test_screenshot_shows_the_page(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    response = client.get(f"/v1/sessions/{session['id']}/screenshot", params={"format": "png"})
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    image = decode(response.content)
    assert image.size == (1280, 800)
    assert image.getpixel((ox + 200, oy + 150)) == RED
    assert image.getpixel((ox + 500, oy + 150)) == GREEN
    assert image.getpixel((ox + 200, oy + 350)) == BLUE


def test_the_python_sdk_drives_a_vm(vm: Vm, origin: tuple[int, int]) -> None:
    ox, oy = origin
    with Deskbox(str(vm.client.base_url), KEY, timeout=120) as box:
        session = box.sessions.get(vm.id)
        assert session.data.backend == "vm"
        assert session.exec(["echo", "from the guest"]).stdout == "from the guest\n"
        image = session.screenshot(format="png", as_image=True)
        assert image.size == (1280, 800)
        assert image.getpixel((ox + 200, oy + 150))[:3] == RED


def test_the_vendor_dialects_drive_a_vm_as_a_container(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    ox, oy = origin
    before = read_page(client, session["id"], lambda s: True)["clicks"]
    blocks = claude(client, session, {"action": "left_click", "coordinate": [ox + 500, oy + 150]})
    assert block_image(blocks).getpixel((ox + 500, oy + 150)) == GREEN
    output = gpt(client, session, {"call_id": "c1", "action": {"type": "screenshot"}})
    assert output_image(output, "c1").getpixel((ox + 200, oy + 350)) == BLUE
    read_page(client, session["id"], lambda s: s["clicks"] == before + 1)


def test_live_view_cdp_files_and_clipboard_work_as_on_runc(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int]
) -> None:
    """What reaches the guest through its agent's raw channels (VNC, DevTools) and calls."""
    ox, oy = origin
    base = f"/v1/sessions/{session['id']}"

    view_token, cdp_token = (token_for(client, session["id"], scope) for scope in ("view", "cdp"))
    with RfbViewer(f"{session['urls']['vnc_ws']}?token={view_token}", timeout_s=60) as view:
        assert tuple(view.full_frame()[oy + 150, ox + 200]) == RED
    with sync_playwright() as playwright:
        browser = playwright.chromium.connect_over_cdp(
            f"{session['urls']['cdp_http']}?token={cdp_token}", timeout=120_000)
        try:
            (page,) = [p for c in browser.contexts for p in c.pages if p.url.startswith("data:")]
            assert page.evaluate("document.getElementById('field').value") == TEXT
        finally:
            browser.close()
    upload = "ünïcode\n".encode() * 1000
    response = client.put(f"{base}/files", params={"path": "/tmp/up.txt"}, content=upload)
    assert response.status_code == 200, response.text
    assert client.get(f"{base}/files", params={"path": "/tmp/up.txt"}).content == upload
    act(client, session, {"type": "clipboard_set", "text": "from the host ✓"})
    got = act(client, session, {"actions": [{"type": "clipboard_get"}]})["results"][0]
    assert got["text"] == "from the host ✓"


def test_a_killed_server_s_vm_is_adopted_by_the_next(
    vm: Vm, origin: tuple[int, int]
) -> None:
    """SIGKILL: QEMU runs on in its own process group, and the next server on the state
    dir takes it over (same QEMU, a new stream to its agent) instead of failing it."""
    leader, qemu = vm.leader(), vm.qemu()
    vm.kill_server()
    assert qemu_pids(leader) == [qemu]  # the VM outlived its server
    vm.start_server()
    body = vm.client.get(f"/v1/sessions/{vm.id}").json()
    assert body["state"] == "running", body
    assert vm.leader() == leader and qemu_pids(leader) == [qemu]
    assert quota_us(vm.cgroup()) == SESSION_QUOTA_US
    ox, oy = origin
    before = read_page(vm.client, vm.id, lambda s: True)
    act(vm.client, vm.session, {"type": "click", "x": ox + 250, "y": oy + 120})
    after = read_page(vm.client, vm.id, lambda s: s["clicks"] > before["clicks"])
    assert after["click"][:2] == [250, 120] and after["value"] == TEXT


def test_pause_freezes_the_guest_and_resume_goes_on(
    client: httpx.Client, session: dict[str, Any], vm: Vm
) -> None:
    sid = session["id"]
    response = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "freeze"})
    assert response.status_code == 200 and response.json()["state"] == "paused"
    qemu = vm.qemu()
    assert _cpu_ticks(qemu) == _cpu_ticks(qemu, after_s=1.0)  # its vCPU threads idle
    response = client.post(f"/v1/sessions/{sid}/resume")
    assert response.status_code == 200 and response.json()["state"] == "running"
    assert read_page(client, sid, lambda s: True)["value"] == TEXT


def _cpu_ticks(pid: int, after_s: float = 0.0) -> int:
    """User CPU ticks of QEMU's vCPU threads (a stopped guest's stay still)."""
    time.sleep(after_s)
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().startswith("CPU "):
                total += int((task / "stat").read_text().rsplit(")", 1)[1].split()[11])
        except OSError:
            continue
    return total


def test_hibernate_ends_qemu_and_resume_brings_the_page_back(
    client: httpx.Client, session: dict[str, Any], vm: Vm, origin: tuple[int, int]
) -> None:
    sid = session["id"]
    leader = vm.leader()
    hibernation = vm.state_dir / "vm" / sid / HIBERNATION_FILE
    response = client.post(f"/v1/sessions/{sid}/pause", json={"mode": "hibernate"})
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "hibernated"
    assert not qemu_pids(leader) and not alive(leader)
    assert hibernation.stat().st_mode & 0o077 == 0
    error = assert_error(client.post(f"/v1/sessions/{sid}/actions",
                                     json={"type": "click", "x": 1, "y": 1}), 409, "conflict")
    assert "hibernated" in error["message"]

    response = client.post(f"/v1/sessions/{sid}/resume")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "running"
    assert not hibernation.exists()
    assert quota_us(vm.cgroup()) == SESSION_QUOTA_US  # restored at the host's full CPU
    ox, oy = origin
    before = read_page(client, sid, lambda s: s["value"] == TEXT)
    act(client, session, {"type": "click", "x": ox + 150, "y": oy + 150})
    after = read_page(client, sid, lambda s: s["clicks"] > before["clicks"])
    assert after["value"] == TEXT and after["click"][:2] == [150, 150]


def test_fork_makes_two_independent_vms(
    client: httpx.Client, session: dict[str, Any], origin: tuple[int, int], vm: Vm
) -> None:
    ox, oy = origin
    response = client.post(f"/v1/sessions/{session['id']}/fork", json={"count": 2})
    assert response.status_code == 201, response.text
    copies = [body["id"] for body in response.json()["sessions"]]
    try:
        assert len(set(copies)) == 2 and session["id"] not in copies
        for number, sid in enumerate(copies):
            act(client, {"id": sid}, {"actions": [
                {"type": "click", "x": ox + 900, "y": oy + 175},
                {"type": "type", "text": str(number)},
            ]})
        for number, sid in enumerate(copies):
            state = read_page(client, sid, lambda s, n=number: s["value"].endswith(str(n)))
            assert state["value"] == f"{TEXT}{number}"
        # The original goes on untouched by its copies' typing.
        assert read_page(client, session["id"], lambda s: True)["value"] == TEXT
        # Each at the session's quota again (the save and the copies' restores had none).
        for sid in [session["id"], *copies]:
            assert quota_us(vm.cgroup(sid)) == SESSION_QUOTA_US
        # What a restarted server needs to take a copy over (a copy had none).
        for sid in copies:
            assert VmConfig.from_json((vm.state_dir / "vm" / sid / CONFIG_FILE).read_text())
    finally:
        for sid in copies:
            assert client.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_snapshot_s_copy_has_its_own_cpus_on_the_snapshot_s_machine(
    client: httpx.Client, session: dict[str, Any], vm: Vm
) -> None:
    """A copy is the snapshot's QEMU migration stream read into a new QEMU, which takes it
    only into the machine it was saved from (vCPUs, guest RAM; the guest's pids limit is in
    its memory): a create ``from_snapshot`` whose resources would change them is a 422
    naming each such field, before anything starts; its ``cpus`` is the copy's own CPU
    quota once it runs (the snapshot's VM has the default 1.0; the copy's restore had
    none)."""
    sid = session["id"]
    page = read_page(client, sid, lambda s: True)
    taken = client.post(f"/v1/sessions/{sid}/snapshots")
    assert taken.status_code == 201, taken.text
    snapshot = taken.json()["id"]
    try:
        before = _session_ids(client)
        refused = client.post("/v1/sessions", json={
            "from_snapshot": snapshot,
            "resources": {"cpus": 2, "memory_mb": 1024, "pids": 512}},
            timeout=10)  # before QEMU starts: a restore takes longer
        assert assert_error(refused, 422, "invalid_request")["message"] == (
            "resources.cpus 2 needs 2 vCPUs, and the snapshot's VM has 1 (give cpus up to 1, "
            "or leave it out); resources.memory_mb 1024 is not the snapshot's 2048 MB of "
            "guest RAM (give 2048, or leave it out); resources.pids 512 is not the "
            "snapshot's limit (none), which its guest set when it booted (leave it out): a "
            "VM restored from memory keeps the machine it was saved with")
        _assert_nothing_made(vm, before)

        made = client.post("/v1/sessions", json={
            "from_snapshot": snapshot, "resources": {"cpus": 0.5}})
        assert made.status_code == 201, made.text
        assert made.json()["state"] == "running"
        copy = made.json()["id"]
        try:
            assert quota_us(vm.cgroup(copy)) == 50_000
            assert quota_us(vm.cgroup()) == SESSION_QUOTA_US  # the original keeps its own
            assert read_page(client, copy, lambda s: True)["value"] == page["value"]
            # Its own hibernations, snapshots and forks, and a restarted server, keep it.
            config = VmConfig.from_json((vm.state_dir / "vm" / copy / CONFIG_FILE).read_text())
            assert (config.cpu_quota, config.cpus, config.memory_mb) == (0.5, 1, 2048)
        finally:
            assert client.delete(f"/v1/sessions/{copy}").status_code == 204
    finally:
        # 204, not 409: the refused create let go of the snapshot too.
        assert client.delete(f"/v1/snapshots/{snapshot}").status_code == 204


def test_delete_leaves_no_qemu_and_no_file(
    client: httpx.Client, session: dict[str, Any], vm: Vm
) -> None:
    pid, runtime, state = vm.leader(), vm.paths().runtime, vm.state_dir / "vm" / vm.id
    assert qemu_pids(pid) and runtime.is_dir() and state.is_dir()
    assert client.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert client.get(f"/v1/sessions/{session['id']}").json()["state"] == "stopped"
    assert not qemu_pids(pid) and not alive(pid)
    assert not runtime.exists() and not state.exists()
    assert not vm.cgroup().directories[0].exists()


def test_deleting_a_booting_vm_ends_its_boot_at_once(client: httpx.Client, vm: Vm) -> None:
    # A create that waits for the VM, from another thread (its own connection).
    answers: list[httpx.Response] = []
    waiting = httpx.Client(base_url=client.base_url, headers=client.headers, timeout=600)
    creator = threading.Thread(target=lambda: answers.append(
        waiting.post("/v1/sessions", json={"timeout_s": 600})))
    creator.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            starting = client.get("/v1/sessions", params={"state": "starting"}).json()
            if starting["sessions"] and vm.paths(starting["sessions"][0]["id"]).pid.exists():
                break  # QEMU runs: the boot takes minutes from here
            assert time.monotonic() < deadline, "the VM did not start booting"
            time.sleep(0.1)
        session_id = starting["sessions"][0]["id"]
        leader = vm.leader(session_id)
        started = time.monotonic()
        assert client.delete(f"/v1/sessions/{session_id}").status_code == 204
        took = time.monotonic() - started
        assert took < 30, f"the delete waited for the boot ({took:.0f} s)"
        creator.join(timeout=30)
        assert answers, "the waiting create did not answer"
        error = assert_error(answers[0], 409, "conflict")
        assert "deleted while it was starting" in error["message"]
    finally:
        creator.join(timeout=600)
        waiting.close()
    assert client.get(f"/v1/sessions/{session_id}").json()["state"] == "stopped"
    assert not qemu_pids(leader) and not alive(leader)
    assert not vm.paths(session_id).runtime.exists()
    assert not (vm.state_dir / "vm" / session_id).exists()
    assert not vm.cgroup(session_id).directories[0].exists()
