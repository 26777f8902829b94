"""The syscall filter: default deny from Podman's allowlist, our denials on top, and only
the socket families a desktop needs (issue 13, section 4).

The translation is checked on small Moby-format profiles of our own; the filter itself from
inside real sandboxes, by making the calls an attacker would.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from deskbox_server.engines.runc.criu import Criu
from deskbox_server.engines.runc.engine import RuncEngine
from deskbox_server.engines.runc.sandbox import RuncOptions, RuncSandbox
from deskbox_server.engines.runc.seccomp import (
    DENIED_SYSCALLS,
    PODMAN_PACKAGE,
    PODMAN_PROFILE,
    SOCKET_FAMILIES,
    SeccompArg,
    SeccompProfile,
    SyscallRule,
    seccomp_profile,
    translate,
    with_our_rules,
)
from deskbox_server.engines.runc.snapshot import TEMPLATE, restore_copy, take_snapshot
from deskbox_server.errors import Internal

from ..sandbox_agent import until_ready
from .conftest import exec_in

# -- the translation (our seam: a Moby-format profile in, the OCI shape out) -------------------


def _moby(*rules: dict[str, Any]) -> dict[str, Any]:
    return {
        "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
        "archMap": [{"architecture": "SCMP_ARCH_X86_64",
                     "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]}],
        "syscalls": list(rules),
    }


def _allow(name: str, **conditions: Any) -> dict[str, Any]:
    return {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [], "comment": "",
            "includes": conditions.get("includes", {}), "excludes": conditions.get("excludes", {})}


def _names(profile: SeccompProfile) -> set[str]:
    return {name for rule in profile["syscalls"] for name in rule["names"]}


def test_translation_keeps_what_applies_to_x86_64_without_capabilities() -> None:
    moby = _moby(
        _allow("read"),
        _allow("arch_prctl", includes={"arches": ["amd64", "x32"]}),
        _allow("set_tls", includes={"arches": ["arm", "arm64"]}),
        _allow("bpf", includes={"caps": ["CAP_SYS_ADMIN"]}),
        _allow("amd64_too_but_cap", includes={"arches": ["amd64"], "caps": ["CAP_SYS_ADMIN"]}),
        {"names": ["chroot"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "errno": "EPERM",
         "args": [], "includes": {}, "excludes": {"caps": ["CAP_SYS_CHROOT"]}},
        _allow("not_on_amd64", excludes={"arches": ["amd64"]}),
        _allow("old_kernel", includes={"minKernel": "4.8"}),
        _allow("future_kernel", includes={"minKernel": "7.1"}),
        _allow("until_kernel_5", excludes={"minKernel": "5.0"}),
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
        {"name": "old_format", "action": "SCMP_ACT_ALLOW", "args": None},
    )
    profile = translate(moby, (6, 18))
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile.get("defaultErrnoRet") == errno.ENOSYS
    assert profile["architectures"] == ["SCMP_ARCH_X86_64"]
    assert _names(profile) == {"read", "arch_prctl", "chroot", "old_kernel", "personality",
                               "old_format"}
    by_name = {rule["names"][0]: rule for rule in profile["syscalls"]}
    assert by_name["chroot"] == {"names": ["chroot"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}
    assert by_name["personality"]["args"] == [
        {"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]
    assert "args" not in by_name["read"]
    # On an older kernel the minKernel conditions turn the other way.
    assert {"old_kernel", "until_kernel_5"} & _names(translate(moby, (4, 4))) == {
        "until_kernel_5"}


def test_translation_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(ValueError, match="default action"):
        translate({**_moby(_allow("read")), "defaultAction": "SCMP_ACT_ALLOW"}, (6, 18))
    with pytest.raises(ValueError, match="condition 'uids'"):
        translate(_moby(_allow("read", includes={"uids": [0]})), (6, 18))
    with pytest.raises(ValueError, match="unexpected content"):
        translate({"defaultAction": "SCMP_ACT_ERRNO"}, (6, 18))


def test_our_denials_win_over_what_the_profile_allows() -> None:
    allowed = ["read", "mount", "setns", "ptrace", "unshare", "clone", "clone3", "socket",
               "socketpair", "keyctl"]
    base = translate(_moby({"names": allowed, "action": "SCMP_ACT_ALLOW"},
                           {"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO",
                            "errnoRet": 1}), (6, 18))
    profile = with_our_rules(base)
    rules_of: dict[str, list[SyscallRule]] = {}
    for rule in profile["syscalls"]:
        for name in rule["names"]:
            rules_of.setdefault(name, []).append(rule)
    assert [rule["action"] for rule in rules_of["read"]] == ["SCMP_ACT_ALLOW"]
    for name in ("mount", "setns", "ptrace", "keyctl", "kexec_load", *DENIED_SYSCALLS):
        assert rules_of[name] == [rules_of["mount"][0]], name  # only our EPERM rule
    assert rules_of["mount"][0]["action"] == "SCMP_ACT_ERRNO"
    assert rules_of["mount"][0].get("errnoRet") == errno.EPERM
    assert [(r["action"], r.get("errnoRet")) for r in rules_of["clone3"]] == [
        ("SCMP_ACT_ERRNO", errno.ENOSYS)]
    # libseccomp refuses a call with two unconditional rules: every name has at most one.
    for name, rules in rules_of.items():
        assert sum("args" not in rule for rule in rules) <= 1, name
        if any("args" not in rule for rule in rules):
            assert len(rules) == 1, name


def _matches(arg: SeccompArg, values: Sequence[int]) -> bool:
    value = values[arg["index"]]
    op = arg["op"]
    if op == "SCMP_CMP_EQ":
        return value == arg["value"]
    if op == "SCMP_CMP_NE":
        return value != arg["value"]
    if op == "SCMP_CMP_GE":
        return value >= arg["value"]
    assert op == "SCMP_CMP_MASKED_EQ", op
    return value & arg["value"] == arg["valueTwo"]


def _decide(profile: SeccompProfile, name: str, values: Sequence[int]) -> tuple[str, int]:
    """What the filter answers: exactly one rule of ours may match (they never overlap)."""
    hits = [
        (rule["action"], rule.get("errnoRet", 0)) for rule in profile["syscalls"]
        if name in rule["names"] and all(_matches(arg, values) for arg in rule.get("args", []))
    ]
    assert len(hits) <= 1, (name, values, hits)
    return hits[0] if hits else ("default", 0)


def test_socket_families_cover_every_value_once() -> None:
    profile = with_our_rules(translate(_moby(), (6, 18)))
    allow = ("SCMP_ACT_ALLOW", 0)
    refuse = ("SCMP_ACT_ERRNO", errno.EAFNOSUPPORT)
    high = [1 << 32 | socket.AF_UNIX, 1 << 32 | socket.AF_INET, (1 << 64) - 1, 1 << 63]
    for family in [*range(0, 300), *high]:
        want = allow if family in SOCKET_FAMILIES else refuse
        assert _decide(profile, "socket", [family, socket.SOCK_STREAM, 0]) == want, family
        want = allow if family == socket.AF_UNIX else refuse
        assert _decide(profile, "socketpair", [family, socket.SOCK_STREAM, 0]) == want, family
    audit = [socket.AF_NETLINK, socket.SOCK_RAW, 9]
    assert _decide(profile, "socket", audit) == ("SCMP_ACT_ERRNO", errno.EINVAL)
    newuser = 0x10000000
    assert _decide(profile, "clone", [newuser | 0x11, 0, 0]) == ("SCMP_ACT_ERRNO", errno.EPERM)
    assert _decide(profile, "unshare", [0x20000, 0, 0]) == allow


def test_the_packaged_profile_translates() -> None:
    """The file setup.sh installs: default deny, and our names left to our rules alone."""
    raw = json.loads(PODMAN_PROFILE.read_text())
    base = translate(raw, (6, 18))
    assert {"mount", "setns", "ptrace", "unshare", "clone"} <= _names(base)  # relying on caps
    profile = seccomp_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile.get("defaultErrnoRet") == errno.ENOSYS
    assert profile["architectures"] == ["SCMP_ARCH_X86_64"]
    ours = with_our_rules({**base, "syscalls": []})["syscalls"]
    owned = {*DENIED_SYSCALLS, "clone", "clone3", "unshare", "socket", "socketpair"}
    theirs = [rule for rule in profile["syscalls"] if rule not in ours]
    assert len(theirs) + len(ours) == len(profile["syscalls"])
    assert not owned & {name for rule in theirs for name in rule["names"]}
    assert "read" in {name for rule in theirs for name in rule["names"]}


def test_without_the_package_no_sandbox_starts(options: RuncOptions, tmp_path: Path) -> None:
    broken = tmp_path / "seccomp.json"
    broken.write_text("{not json")
    for source in (tmp_path / "missing.json", broken):
        with pytest.raises(Internal, match=PODMAN_PACKAGE) as raised:
            seccomp_profile(source)
        assert str(source) in raised.value.message
        without = dataclasses.replace(options, seccomp_source=source)
        with pytest.raises(Internal, match=PODMAN_PACKAGE):
            RuncSandbox.start(without, f"t-noprofile-{os.getpid()}", browser=False)
        assert not (options.state_dir / "sessions" / f"t-noprofile-{os.getpid()}").exists()


async def test_backend_refuses_to_prepare_without_the_package(
    options: RuncOptions, tmp_path: Path
) -> None:
    backend = RuncEngine(
        dataclasses.replace(options, seccomp_source=tmp_path / "missing.json")
    )
    with pytest.raises(Internal, match=PODMAN_PACKAGE):
        await backend.prepare()


# -- inside a sandbox -------------------------------------------------------------------------

_PROBE = """
import ctypes, json, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {}
for name, nr, args in json.loads(sys.argv[1]):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    out[name] = 0 if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""

# name: (number, arguments); each is harmless where the kernel runs it.
NR_SOCKET, NR_SOCKETPAIR = 41, 53


def _probe_host(calls: dict[str, tuple[int, list[int]]]) -> dict[str, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    for name, (nr, args) in calls.items():
        ctypes.set_errno(0)
        result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        out[name] = 0 if result >= 0 else ctypes.get_errno()
        if result >= 0 and nr in (NR_SOCKET,):
            os.close(result)
    return out


def _probe(sandbox: RuncSandbox, calls: dict[str, tuple[int, list[int]]]) -> dict[str, int]:
    """errno of each call made inside the sandbox (0: it succeeded)."""
    payload = json.dumps([[name, nr, args] for name, (nr, args) in calls.items()])
    done = exec_in(sandbox, "python3", "-c", _PROBE, payload)
    assert done.returncode == 0, done.stderr
    result: dict[str, int] = json.loads(done.stdout)
    return result


def _socket(family: int, kind: int = socket.SOCK_STREAM, proto: int = 0) -> tuple[int, list[int]]:
    return NR_SOCKET, [family, kind, proto]


def test_vsock_and_other_families_cannot_be_created(sandbox: RuncSandbox) -> None:
    """The attack: a vsock socket (one port space for every session, outside egress rules)."""
    refused = {
        "vsock": _socket(socket.AF_VSOCK),
        "vsock_dgram": _socket(socket.AF_VSOCK, socket.SOCK_DGRAM),
        "packet": _socket(socket.AF_PACKET, socket.SOCK_RAW),
        "alg": _socket(socket.AF_ALG, socket.SOCK_SEQPACKET),
        "bluetooth": _socket(31, socket.SOCK_STREAM),
        "unix_with_high_bits": _socket(1 << 32 | socket.AF_UNIX),
        "socketpair_inet": (NR_SOCKETPAIR, [socket.AF_INET, socket.SOCK_STREAM, 0, 0]),
    }
    # The host has vsock (virtio-vsock) and packet sockets: the refusal is the filter's.
    host = _probe_host({"vsock": refused["vsock"], "packet": refused["packet"],
                        "unix_with_high_bits": refused["unix_with_high_bits"]})
    assert host == {"vsock": 0, "packet": 0, "unix_with_high_bits": 0}
    inside = _probe(sandbox, refused)
    assert inside == dict.fromkeys(refused, errno.EAFNOSUPPORT)
    # And so no vsock port can be bound, in this session or seen from another one.
    bind = (
        "import socket\n"
        "try:\n s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)\n"
        " s.bind((socket.VMADDR_CID_ANY, 5000)); print('bound')\n"
        "except OSError as e: print('refused', e.errno)\n"
    )
    assert exec_in(sandbox, "python3", "-c", bind).stdout.split() == [
        "refused", str(errno.EAFNOSUPPORT)]


def test_the_families_a_desktop_needs_still_work(sandbox: RuncSandbox) -> None:
    code = (
        "import socket as S\n"
        "for family, kind in ((S.AF_UNIX, S.SOCK_STREAM), (S.AF_UNIX, S.SOCK_DGRAM),\n"
        "        (S.AF_INET, S.SOCK_STREAM), (S.AF_INET, S.SOCK_DGRAM),\n"
        "        (S.AF_INET6, S.SOCK_STREAM), (S.AF_INET6, S.SOCK_DGRAM),\n"
        "        (S.AF_NETLINK, S.SOCK_RAW)):\n"
        "    S.socket(family, kind, 0).close()\n"
        "a, b = S.socketpair(); a.sendall(b'x'); assert b.recv(1) == b'x'\n"
        "s = S.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
        "c = S.create_connection(s.getsockname()); c.close()\n"
        "s6 = S.socket(S.AF_INET6); s6.bind(('::1', 0)); s6.close()\n"
        "try:\n S.socket(S.AF_NETLINK, S.SOCK_RAW, 9); print('audit opened')\n"
        "except OSError as e: print('audit', e.errno)\n"
        "print('ok')\n"
    )
    done = exec_in(sandbox, "python3", "-c", code)
    assert done.stdout.split() == ["audit", str(errno.EINVAL), "ok"], done.stderr
    # Netlink in use: glibc's if_nameindex asks the kernel over it (loopback only here).
    links = exec_in(sandbox, "python3", "-c", "import socket; print(socket.if_nameindex())")
    assert links.stdout.strip() == "[(1, 'lo')]", links.stderr


def test_syscalls_the_profile_does_not_list_fail_with_enosys(sandbox: RuncSandbox) -> None:
    """Default deny: calls this kernel has (6.x) but Podman's list does not name."""
    unlisted = {
        "futex_waitv": (449, [0, 0, 0, 0, 0]),  # no futexes: EINVAL where it runs
        "cachestat": (451, [-1, 0, 0, 0]),  # a bad descriptor: EBADF where it runs
    }
    raw = json.loads(PODMAN_PROFILE.read_text())
    assert not set(unlisted) & {name for rule in raw["syscalls"] for name in rule["names"]}
    host = _probe_host(unlisted)
    assert host == {"futex_waitv": errno.EINVAL, "cachestat": errno.EBADF}
    assert _probe(sandbox, unlisted) == dict.fromkeys(unlisted, errno.ENOSYS)


def test_our_denials_win_inside(sandbox: RuncSandbox) -> None:
    """Podman's list allows these (it relies on capabilities); the kernel would run each
    here without one and answer as noted, so EPERM/ENOSYS is the filter's doing."""
    calls = {
        "ptrace_traceme": (101, [0, 0, 0, 0]),  # the kernel: 0
        "setns": (308, [-1, 0]),  # EBADF
        "process_vm_readv": (310, [1, 0, 0, 0, 0, 0]),  # 0 bytes: 0
        "unshare_user": (272, [0x10000000]),  # would make a user namespace
        "clone3": (435, [0, 0]),  # EINVAL
    }
    assert _probe(sandbox, calls) == {
        "ptrace_traceme": errno.EPERM, "setns": errno.EPERM, "process_vm_readv": errno.EPERM,
        "unshare_user": errno.EPERM, "clone3": errno.ENOSYS,
    }
    # clone without CLONE_NEWUSER still works: fork, threads, a shell pipeline.
    done = exec_in(sandbox, "sh", "-c", "echo hi | cat && python3 -c "
                   "'import threading; t = threading.Thread(target=print, args=(\"t\",)); "
                   "t.start(); t.join()'")
    assert done.stdout.split() == ["hi", "t"], done.stderr


@pytest.mark.skipif(Criu().missing() is not None,
                    reason="CRIU 4.1 is not installed (scripts/criu.sh)")
def test_a_copy_of_an_old_snapshot_execs_under_todays_filter(
    options: RuncOptions, tmp_path: Path
) -> None:
    """A snapshot taken under a default-allow filter (before this one): CRIU gives the
    restored processes the filter they were dumped with, but what ``runc exec`` starts in
    the copy gets today's. The copy's own processes keep a filter through the restore."""
    original = RuncSandbox.start(
        dataclasses.replace(options, id_prefix="deskbox-seccomp-"), f"o{os.getpid()}",
        browser=False,
    )
    snapshot = tmp_path / "snapshot"
    try:
        # Started, not yet ready: a connection its start-up made and closed while it still
        # waited in a listener's queue is one CRIU refuses ("a closed in-flight socket").
        until_ready(original, browser=False)
        take_snapshot(original, Criu(), snapshot, packed=False)
    finally:
        original.destroy()
    template = json.loads((snapshot / TEMPLATE).read_text())
    template["config"]["linux"]["seccomp"] = {
        "defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [],
    }
    (snapshot / TEMPLATE).write_text(json.dumps(template))
    copy = restore_copy(options, f"c{os.getpid()}", snapshot, Criu())
    try:
        status = exec_in(copy, "cat", "/proc/1/status").stdout
        assert "Seccomp:\t2" in status
        calls = {"vsock": _socket(socket.AF_VSOCK), "cachestat": (451, [-1, 0, 0, 0])}
        assert _probe(copy, calls) == {"vsock": errno.EAFNOSUPPORT, "cachestat": errno.ENOSYS}
    finally:
        copy.destroy()
