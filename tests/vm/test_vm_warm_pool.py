"""The warm pool with the vm engine as the default: a plain create takes the VM the pool
booted ahead (at once, where a boot under TCG takes minutes), the reaper ends it when its
timeout passes, and a shutdown cancels the refill's boot instead of waiting it out.

Last in the package (by name): the claim starts a refill, a VM boot that would otherwise
slow the tests after it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from deskbox_server.engines.vm.sandbox import runtime_root

from ..api.helpers import decode
from ..images import IMAGE_STATE_DIR, recipe_module
from .conftest import BOOT_TIMEOUT_S, PoolServer, qemu_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

READY = 'deskbox_pool_ready{display="1280x800"} 1'


def pool_qemus(server: PoolServer) -> list[int]:
    """This server's QEMU processes (their command line names its runtime root)."""
    root = str(runtime_root(server.state_dir)).encode()
    found = []
    for pid in qemu_pids():
        try:
            if root in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_the_vm_engine_holds_its_image_for_prune_to_see(pool_server: PoolServer) -> None:
    """A vm-only server is a user of the session image its guest boots from, whether a VM
    runs or not: a prune from a newer recipe keeps the image (a dry run, on the suite's
    shared cache). Its QEMU's hold alone would end with its last VM."""
    with recipe_module("prune") as prune:
        current = prune.build.load_recipe()
        newer = dataclasses.replace(current, script=current.script + b"\n# a newer recipe\n")
        users = prune._image_users(IMAGE_STATE_DIR / "images", newer)
    assert pool_server.process.pid in users.get(current.hash, {}), users


def test_a_plain_create_takes_the_warm_vm_the_reaper_ends_it_and_shutdown_cancels_the_refill(
    pool_server: PoolServer,
) -> None:
    client = pool_server.client
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while READY not in client.get("/metrics").text:
        assert time.monotonic() < deadline, "the pool's VM did not get ready"
        time.sleep(0.5)
    (warm,) = pool_qemus(pool_server)

    started = time.monotonic()
    created = client.post("/v1/sessions", json={"timeout_s": 8})
    took = time.monotonic() - started
    assert created.status_code == 201, created.text
    session = created.json()
    print(f"create from a warm VM: {took * 1000:.0f} ms")
    assert session["state"] == "running" and session["backend"] == "vm"
    assert took < 15  # no boot: a VM under TCG needs a minute or more to paint its page
    assert warm in pool_qemus(pool_server)  # the session is the VM that was ready
    shot = client.get(f"/v1/sessions/{session['id']}/screenshot", params={"format": "png"})
    assert shot.status_code == 200, shot.text
    assert decode(shot.content).size == (1280, 800)
    # Its timeout passes: the reaper stops it, and its QEMU.
    deadline = time.monotonic() + 60
    while client.get(f"/v1/sessions/{session['id']}").json()["state"] != "stopped":
        assert time.monotonic() < deadline, "the reaper did not stop the VM session"
        time.sleep(0.5)
    assert warm not in pool_qemus(pool_server)

    # The claim started a refill: a VM booting now. A shutdown cancels that boot.
    deadline = time.monotonic() + 60
    while not pool_qemus(pool_server):
        assert time.monotonic() < deadline, "the pool did not start a refill"
        time.sleep(0.2)
    stopping = time.monotonic()
    os.kill(pool_server.process.pid, signal.SIGTERM)
    pool_server.process.wait(timeout=60)
    took = time.monotonic() - stopping
    assert took < 20, f"the shutdown waited for the refill's boot ({took:.0f} s)"
    # A graceful stop: uvicorn, done, ends by the signal it was stopped with.
    assert pool_server.process.returncode in (0, -signal.SIGTERM)
    assert not pool_qemus(pool_server)
