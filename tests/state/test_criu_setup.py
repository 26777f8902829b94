"""How CRIU is run: its kernel cache (engines/runc/kerndat.py), its network lock, its
tmpfs images (scripts/criu.sh's wrapper and helpers), each of which cost checkpoints or
restores tens of ms, and the freeze a dump leaves as it found it."""

from __future__ import annotations

import gzip
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from deskbox_server.engines.runc import criu, freezer, kerndat
from deskbox_server.engines.runc.criu import Criu, dump, restore
from deskbox_server.engines.runc.sandbox import RuncSandbox

from ..isolation.conftest import exec_in

pytestmark = pytest.mark.skipif(Criu().missing() is not None,
                                reason="CRIU 4.1 is not installed (scripts/criu.sh)")

_KDAT_MAGIC = 0x57023458  # criu/include/magic.h: the first word of CRIU's cache
_NETWORK_LOCK_FIELD = 11  # images/inventory.proto: network_lock_method
_NETWORK_LOCK_SKIP = 2  # criu/include/cr_options.h: NETWORK_LOCK_SKIP


@pytest.fixture
def disk_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a host whose /run is no tmpfs, where CRIU keeps no cache of its own."""
    monkeypatch.setattr(kerndat, "_run_fstype", lambda: "ext4")


def test_the_cache_is_made_where_criu_cannot_keep_one(tmp_path: Path, disk_run: None) -> None:
    cache = tmp_path / "criu.kdat"
    assert kerndat.keep_kerndat_cache(Criu().wrapper, cache)
    data = cache.read_bytes()
    assert struct.unpack_from("<I", data)[0] == _KDAT_MAGIC
    assert cache.stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("criu.kdat.*")), "no partial file is left behind"


def test_a_cache_from_before_this_boot_is_made_again(tmp_path: Path, disk_run: None) -> None:
    cache = tmp_path / "criu.kdat"
    cache.write_bytes(b"a cache of another kernel")
    os.utime(cache, (0, 0))  # 1970: before this boot
    assert kerndat.keep_kerndat_cache(Criu().wrapper, cache)
    assert struct.unpack_from("<I", cache.read_bytes())[0] == _KDAT_MAGIC
    fresh = cache.read_bytes()
    assert kerndat.keep_kerndat_cache(Criu().wrapper, cache)
    assert cache.read_bytes() == fresh, "a cache of this boot is kept as it is"


def test_without_criu_there_is_no_cache_and_no_error(tmp_path: Path, disk_run: None) -> None:
    cache = tmp_path / "criu.kdat"
    assert not kerndat.keep_kerndat_cache(tmp_path / "no-criu", cache)
    assert not cache.exists()


def test_criu_loads_the_cache_the_server_keeps(tmp_path: Path) -> None:
    assert kerndat.keep_kerndat_cache(Criu().wrapper)
    for attempt in ("first", "second"):  # where /run is a tmpfs, CRIU's first run saves it
        log = tmp_path / f"{attempt}.log"
        subprocess.run([str(Criu().wrapper), "check", "-v4", "-o", str(log)],
                       capture_output=True, timeout=60, check=False)
    assert f"Loaded kdat cache from {kerndat.KERNDAT_CACHE}" in log.read_text()


# -- the network lock ----------------------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _inventory_field(images: Path, number: int) -> int | None:
    """A varint field of CRIU's inventory image: two magic words, the entry's length, then
    the protobuf entry."""
    data = (images / "inventory.img").read_bytes()
    (size,) = struct.unpack_from("<I", data, 8)
    entry, at = data[12:12 + size], 0
    while at < len(entry):
        key, at = _varint(entry, at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(entry, at)
            if field == number:
                return value
        elif wire == 2:
            length, at = _varint(entry, at)
            at += length
        else:
            at += 8 if wire == 1 else 4
    return None


@pytest.mark.slow
def test_checkpoints_skip_the_network_lock(sandbox: RuncSandbox, tmp_path: Path) -> None:
    images, logs = tmp_path / "images", tmp_path / "work"
    images.mkdir()
    logs.mkdir()
    dump(sandbox, Criu(), images, logs, leave_running=True)
    assert _inventory_field(images, _NETWORK_LOCK_FIELD) == _NETWORK_LOCK_SKIP


# -- tmpfs images --------------------------------------------------------------------------


def _sandbox_shell(sandbox: RuncSandbox, script: str) -> str:
    done = exec_in(sandbox, "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_tmpfs_is_kept_as_plain_tar_and_gzipped_images_still_restore(
    sandbox: RuncSandbox, tmp_path: Path
) -> None:
    _sandbox_shell(sandbox, "echo kept in a tmpfs > /tmp/mark")
    images, dump_logs, restore_logs = tmp_path / "images", tmp_path / "dump", tmp_path / "restore"
    for directory in (images, dump_logs, restore_logs):
        directory.mkdir()
    dump(sandbox, Criu(), images, dump_logs, leave_running=False)
    sandbox.release_init()
    tmpfs_images = sorted(images.glob("tmpfs-dev-*.img"))
    assert tmpfs_images
    for image in tmpfs_images:
        data = image.read_bytes()
        assert data[257:262] == b"ustar", f"{image.name} is not a plain tar"
        # What CRIU wrote before scripts/criu.sh's tar helper: a checkpoint of then.
        image.write_bytes(gzip.compress(data, compresslevel=1))
    restore(sandbox, Criu(), images, restore_logs)
    assert _sandbox_shell(sandbox, "cat /tmp/mark") == "kept in a tmpfs\n"


# -- the freeze ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_dump_leaves_the_sandbox_running_or_frozen_as_it_was(
    sandbox: RuncSandbox, tmp_path: Path
) -> None:
    """CRIU freezes the sandbox for the dump and thaws it after, unless it was frozen
    before (a paused session): a snapshot neither pauses nor resumes it."""
    container_id = sandbox.container_id
    for was_frozen in (False, True):
        if was_frozen:
            freezer.freeze(container_id)
        images, logs = tmp_path / f"images-{was_frozen}", tmp_path / f"work-{was_frozen}"
        images.mkdir()
        logs.mkdir()
        dump(sandbox, Criu(), images, logs, leave_running=True)
        assert freezer.frozen(container_id) is was_frozen
    freezer.thaw(container_id)
    assert _sandbox_shell(sandbox, "echo alive") == "alive\n"


@pytest.mark.slow
def test_criu_looks_again_at_a_freezing_sandbox_within_milliseconds(
    sandbox: RuncSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CRIU 4.1.1 looks at a cgroup it is freezing again only 100 ms later, while a freeze
    takes about a millisecond; patched (scripts/criu-freeze-poll.patch), it looks every
    0.2 ms at first. Two busy processes in the sandbox make the first look find it still
    freezing."""
    spin = "(while :; do :; done) </dev/null >/dev/null 2>&1 &"
    _sandbox_shell(sandbox, f"{spin} {spin}")
    monkeypatch.setattr(criu, "CRIU_OPTIONS",
                        criu.CRIU_OPTIONS.replace("verbosity=1", "verbosity=4"))
    looks = re.compile(r"^\((\d+\.\d+)\) freezer\.state=(\w+)$", re.MULTILINE)
    saw_freezing = False
    for attempt in range(3):
        images, logs = tmp_path / f"images-{attempt}", tmp_path / f"work-{attempt}"
        images.mkdir()
        logs.mkdir()
        dump(sandbox, Criu(), images, logs, leave_running=True)
        states = [(float(at), state) for at, state in looks.findall(
            (logs / "dump.log").read_text())]
        assert states and states[0][1] == "THAWED", states[:3]
        frozen_at = next(at for at, state in states if state == "FROZEN")
        saw_freezing |= any(state == "FREEZING" for _, state in states)
        waited = frozen_at - states[0][0]
        assert waited < 0.05, f"CRIU saw the freeze done after {waited:.3f} s"
    assert saw_freezing, "the busy sandbox was frozen at CRIU's first look every time"


# -- cgroups -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_dump_collects_the_sandboxs_cgroups_once(
    sandbox: RuncSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CRIU 4.1.1 compared each thread's cgroups with the sets it had made before giving
    them the init's cgroup-namespace prefix, so no thread outside the init matched one: each
    made a set of its own and collected every controller again (a mount and a walk each;
    ~55 ms of a desktop's dump). Patched (scripts/criu-cgroup-sets.patch), they share one:
    CRIU's own set and the sandbox's."""
    monkeypatch.setattr(criu, "CRIU_OPTIONS",
                        criu.CRIU_OPTIONS.replace("verbosity=1", "verbosity=4"))
    images, logs = tmp_path / "images", tmp_path / "work"
    images.mkdir()
    logs.mkdir()
    dump(sandbox, Criu(), images, logs, leave_running=True)
    log = (logs / "dump.log").read_text()
    threads, sets = log.count("Dumping cgroups for thread"), log.count("New css ID")
    assert threads >= 6, threads  # CRIU itself, the init, Xvfb, openbox, the agent's threads
    assert sets == 2, f"{sets} cgroup sets made for {threads} threads"
