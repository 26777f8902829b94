"""The check that a restored sandbox's mounts are its config's (engines/runc/mounts.py), on
mount tables read from real sandboxes of this host: a fresh one passes, and each way CRIU
got a restore wrong is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from deskbox_server.engines.runc.layout import RuntimeConfig, SandboxConfig, runtime_config
from deskbox_server.engines.runc.mounts import mismatches, parse_mountinfo, repair_commands

# A fresh sandbox without a user namespace (runc made every mount from the config).
FRESH = """\
71 45 7:0 / / ro,relatime - erofs /dev/loop0 ro,user_xattr,acl,cache_strategy=readaround
72 71 0:41 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
73 71 0:42 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
74 73 0:43 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620,ptmxmode=666
75 73 0:44 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,size=65536k
76 73 0:40 / /dev/mqueue rw,nosuid,nodev,noexec,relatime - mqueue mqueue rw
77 71 0:45 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro
78 71 0:46 / /tmp rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=524288k
79 71 0:47 / /run rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=65536k,mode=755
80 71 0:48 / /root rw,nosuid,nodev,relatime - tmpfs tmpfs rw,size=524288k,mode=700
81 78 0:39 /x11 /tmp/.X11-unix rw,nosuid,nodev,noexec,relatime - tmpfs deskbox rw,size=256k
46 72 0:41 /bus /proc/bus ro,nosuid,nodev,noexec,relatime - proc proc rw
47 72 0:41 /fs /proc/fs ro,nosuid,nodev,noexec,relatime - proc proc rw
48 72 0:41 /irq /proc/irq ro,nosuid,nodev,noexec,relatime - proc proc rw
49 72 0:41 /sys /proc/sys ro,nosuid,nodev,noexec,relatime - proc proc rw
50 72 0:49 / /proc/acpi ro,relatime - tmpfs tmpfs ro
51 72 0:42 /null /proc/keys rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
52 72 0:42 /null /proc/timer_list rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
54 77 0:50 / /sys/firmware ro,relatime - tmpfs tmpfs ro
"""


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """The /proc and /sys paths runc masked or made read-only on the host these tables
    were read on (which of them exist depends on the kernel)."""
    for path in ("proc/acpi", "sys/firmware", "proc/bus", "proc/fs", "proc/irq", "proc/sys"):
        (tmp_path / path).mkdir(parents=True)
    for path in ("proc/keys", "proc/timer_list"):
        (tmp_path / path).touch()
    return tmp_path


def config(user_ids: tuple[int, int] | None = None) -> RuntimeConfig:
    return runtime_config(SandboxConfig(
        rootfs=Path("/image"), socket_dir=Path("/x11"), args=("init",), user_ids=user_ids,
    ))


def test_a_fresh_sandbox_has_the_mounts_of_its_config(host_root: Path) -> None:
    table = parse_mountinfo(FRESH)
    assert mismatches(table, config(), host_root) == []
    assert repair_commands(table, config(), host_root) == []


def test_what_criu_got_wrong_is_named_and_repaired(host_root: Path) -> None:
    restored = (
        FRESH.replace("/ / ro,relatime - erofs", "/ / rw,nosuid,relatime - erofs")
        .replace("0:42 /null /proc/keys rw,nosuid - tmpfs tmpfs",
                 "0:6 /null /proc/keys rw,relatime - devtmpfs devtmpfs")
    )
    table = parse_mountinfo(restored)
    problems = mismatches(table, config(), host_root)
    assert "/: rw, the config says ro" in problems
    assert any(p.startswith("/proc/keys: masked with devtmpfs 0:6 /null") for p in problems)
    assert len(problems) == 2, problems
    assert repair_commands(table, config(), host_root) == [
        ("readonly-root", "/", ("nosuid", "relatime", "rw")),
        ("mask", "/proc/keys", ()),
    ]


def test_missing_extra_and_weakened_mounts_are_named(host_root: Path) -> None:
    lines = FRESH.splitlines()
    without_sys = [line for line in lines if " /sys ro" not in line]
    weakened = [line.replace("/tmp rw,nosuid,nodev,", "/tmp rw,") for line in without_sys]
    extra = [*weakened, "99 71 0:60 / /mnt rw,relatime - tmpfs tmpfs rw"]
    problems = mismatches(parse_mountinfo("\n".join(extra)), config(), host_root)
    assert "/sys: not mounted" in problems
    assert "/tmp: without nodev, nosuid" in problems
    assert "/mnt: mounted, the config has no such mount" in problems


def test_in_a_user_namespace_devices_and_masks_are_binds_of_its_dev_null(
    host_root: Path,
) -> None:
    devices = "".join(
        f"9{index} 73 0:6 /{name} /dev/{name} rw,relatime - devtmpfs devtmpfs rw\n"
        for index, name in enumerate(("null", "zero", "full", "random", "urandom", "tty"))
    )
    fresh = "".join(
        line.replace("0:42 /null", "0:6 /null").replace("- tmpfs tmpfs", "- devtmpfs devtmpfs")
        + "\n" if "/null /proc/" in line else line + "\n"
        for line in FRESH.splitlines()
    ) + devices
    user = config((100000, 65536))
    assert mismatches(parse_mountinfo(fresh), user, host_root) == []
    # Without the user namespace the same binds are the host's, not the sandbox's own.
    assert mismatches(parse_mountinfo(fresh), config(), host_root)
