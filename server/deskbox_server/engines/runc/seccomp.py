"""The seccomp profile of a session sandbox, in the OCI runtime spec's JSON shape.

Default deny (an allowlist): a system call the profile does not name fails with ENOSYS, so
one that a future kernel adds stays closed until someone looks at it. The allowlist is the
one Podman uses, read at run time from ``/usr/share/containers/seccomp.json`` of Debian's
``golang-github-containers-common`` package (scripts/setup.sh installs it): it is maintained
upstream for ordinary Linux programs, which is what a desktop (Xvfb, openbox, x11vnc,
Chromium with ``--no-sandbox``) and whatever an agent starts through ``exec`` are. Without
that file there is no weaker fallback: the container backend does not prepare (the server
does not start), and a sandbox start or restore that cannot read it fails
(:class:`~deskbox_server.errors.Internal` naming the package; the session's failure reason).

That file is in Moby's format, for any architecture and capability set; :func:`translate`
keeps what applies to an x86-64 process holding no capability (ours hold none). Only the
native x86-64 ABI is listed, so 32-bit (int 0x80) and x32 system calls fail as a bad
architecture.

On top of it, ours (:func:`with_our_rules`), which win over anything the file allows (it
allows mount, setns, unshare, ptrace and more, relying on capabilities we do not grant):

- ``DENIED_SYSCALLS`` fail with EPERM: what a desktop never needs and what widens the
  kernel's attack surface (mounting, module and kexec loading, tracing other processes, BPF,
  keyrings, perf, userfaultfd, io_uring, clock changes, handle-based opens);
- clone and unshare fail with EPERM when asked for a user namespace (the door to every other
  namespace without capabilities); clone3 reports ENOSYS, so libc falls back to clone;
- socket() creates only AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK sockets (the audit
  netlink answers EINVAL, as in Podman's profile), socketpair() only AF_UNIX ones; any other
  family fails with EAFNOSUPPORT. vsock above all is not per network namespace: sessions
  would share one port space, outside the egress rules.

The filter applies to the sandbox's processes and to every ``runc exec`` in it. CRIU gives
restored processes the filter they were dumped with; a restored copy's config carries
today's profile (``oci.SandboxTemplate.for_copy``), so what runs through ``exec`` there has it.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from ...errors import Internal

__all__ = [
    "DENIED_SYSCALLS",
    "PODMAN_PACKAGE",
    "PODMAN_PROFILE",
    "SOCKET_FAMILIES",
    "SeccompArg",
    "SeccompProfile",
    "SyscallRule",
    "seccomp_profile",
    "translate",
    "with_our_rules",
]

PODMAN_PACKAGE = "golang-github-containers-common"
PODMAN_PROFILE = Path("/usr/share/containers/seccomp.json")

# Every name here fails with EPERM.
DENIED_SYSCALLS: tuple[str, ...] = (
    # filesystems and mounts
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "swapon", "swapoff",
    "quotactl", "quotactl_fd", "name_to_handle_at", "open_by_handle_at", "nfsservctl",
    "sysfs", "ustat", "uselib", "acct",
    # namespaces (user namespaces are refused by flag, below)
    "setns",
    # the kernel itself
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "syslog",
    "iopl", "ioperm", "_sysctl", "lookup_dcookie", "vm86", "vm86old",
    # other processes
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "process_madvise",
    # attack surface a desktop does not use
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "add_key", "request_key", "keyctl", "fanotify_init",
    "move_pages", "migrate_pages", "mbind", "set_mempolicy",
    # clocks are the host's
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
)

# What a desktop talks over: X and D-Bus (unix), the web (inet), the kernel's netlink.
SOCKET_FAMILIES: tuple[int, ...] = tuple(
    int(family) for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
)
_NETLINK_AUDIT = 9
_CLONE_NEWUSER = 0x10000000
_U64 = (1 << 64) - 1
# Moby's name of the one architecture we list.
_ARCH = "amd64"
# Every name whose rules are ours alone: the file's rules for them are dropped.
_OWNED = frozenset((*DENIED_SYSCALLS, "clone", "clone3", "unshare", "socket", "socketpair"))


class SeccompArg(TypedDict):
    index: int
    value: int
    valueTwo: int
    op: str


class _SyscallRuleBase(TypedDict):
    names: list[str]
    action: str


class SyscallRule(_SyscallRuleBase, total=False):
    errnoRet: int
    args: list[SeccompArg]


class SeccompProfile(TypedDict):
    defaultAction: str
    defaultErrnoRet: NotRequired[int]
    architectures: list[str]
    syscalls: list[SyscallRule]


def seccomp_profile(source: Path = PODMAN_PROFILE) -> SeccompProfile:
    """The sandbox's profile: the Podman allowlist at ``source``, translated, plus ours.

    Internal, naming the package, if ``source`` is missing, unreadable or not a profile.
    """
    try:
        moby = json.loads(source.read_text())
        return with_our_rules(translate(moby, _kernel_version()))
    except (OSError, ValueError) as error:
        raise Internal(
            f"the syscall allowlist {source} cannot be used ({error}); it comes with the "
            f"Debian package {PODMAN_PACKAGE} (scripts/setup.sh installs it), and no sandbox "
            "starts without it"
        ) from None


def _kernel_version() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def translate(moby: Any, kernel: tuple[int, int]) -> SeccompProfile:
    """Moby's profile format, as it applies to an x86-64 process with no capability on
    ``kernel`` (major, minor), in the OCI runtime spec's shape.

    A rule applies unless its ``includes`` ask for a capability, another architecture or a
    newer kernel, or its ``excludes`` name x86-64 or an older kernel; ``excludes`` of
    capabilities hold (we have none). ValueError for a default that allows, or for content
    or a condition we do not know: guessing could open a call.
    """
    try:
        default = str(moby["defaultAction"])
        if default in ("SCMP_ACT_ALLOW", "SCMP_ACT_LOG"):
            raise ValueError(f"its default action is {default}, not a denial")
        profile: SeccompProfile = {
            "defaultAction": default, "architectures": ["SCMP_ARCH_X86_64"], "syscalls": [],
        }
        if "defaultErrnoRet" in moby:
            profile["defaultErrnoRet"] = int(moby["defaultErrnoRet"])
        for raw in moby["syscalls"]:
            if _applies(raw.get("includes") or {}, raw.get("excludes") or {}, kernel):
                profile["syscalls"].append(_rule(raw))
    except (KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"unexpected content: {error!r}") from None
    return profile


def _applies(includes: Mapping[str, Any], excludes: Mapping[str, Any],
             kernel: tuple[int, int]) -> bool:
    for key in (*includes, *excludes):
        if key not in ("caps", "arches", "minKernel"):
            raise ValueError(f"a rule has the condition {key!r}")
    if includes.get("caps"):
        return False
    if includes.get("arches") and _ARCH not in includes["arches"]:
        return False
    if _ARCH in (excludes.get("arches") or ()):
        return False
    if includes.get("minKernel") and kernel < _version(includes["minKernel"]):
        return False
    return not (excludes.get("minKernel") and kernel >= _version(excludes["minKernel"]))


def _version(text: str) -> tuple[int, int]:
    major, minor = str(text).split(".")[:2]
    return int(major), int(minor)


def _rule(raw: Mapping[str, Any]) -> SyscallRule:
    names = raw["names"] if "names" in raw else [raw["name"]]
    rule: SyscallRule = {"names": [str(name) for name in names], "action": str(raw["action"])}
    if "errnoRet" in raw:
        rule["errnoRet"] = int(raw["errnoRet"])
    args = [
        _arg(int(arg["index"]), str(arg["op"]), int(arg["value"]), int(arg.get("valueTwo", 0)))
        for arg in raw.get("args") or ()
    ]
    if args:
        rule["args"] = args
    return rule


def _arg(index: int, op: str, value: int, value_two: int = 0) -> SeccompArg:
    return {"index": index, "value": value, "valueTwo": value_two, "op": op}


def with_our_rules(base: SeccompProfile) -> SeccompProfile:
    """``base`` with our denials, which win: the names we rule on are taken out of every
    rule of ``base`` (libseccomp refuses a call ruled on twice with different actions), then
    given rules of ours."""
    rules: list[SyscallRule] = []
    for rule in base["syscalls"]:
        names = [name for name in rule["names"] if name not in _OWNED]
        if names:
            rules.append({**rule, "names": names})
    rules += _our_rules()
    return {**base, "syscalls": rules}


def _our_rules() -> list[SyscallRule]:
    eperm = errno.EPERM
    # clone's and unshare's first argument holds the namespace flags; MASKED_EQ compares
    # the argument ANDed with ``value`` to ``valueTwo``.
    newuser = _CLONE_NEWUSER
    rules: list[SyscallRule] = [
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": eperm},
        {"names": ["clone", "unshare"], "action": "SCMP_ACT_ALLOW",
         "args": [_arg(0, "SCMP_CMP_MASKED_EQ", newuser, 0)]},
        {"names": ["clone", "unshare"], "action": "SCMP_ACT_ERRNO", "errnoRet": eperm,
         "args": [_arg(0, "SCMP_CMP_MASKED_EQ", newuser, newuser)]},
        # clone3 passes its flags in memory seccomp cannot read: report it missing, so
        # libc falls back to clone, whose flags we can check.
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    for family in SOCKET_FAMILIES:
        if family == socket.AF_NETLINK:
            # The audit socket needs CAP_AUDIT_WRITE: as in the Podman profile, EINVAL
            # tells login tools that audit is off, instead of failing them later.
            rules += [
                {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                 "args": [_arg(0, "SCMP_CMP_EQ", family),
                          _arg(2, "SCMP_CMP_NE", _NETLINK_AUDIT)]},
                {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EINVAL,
                 "args": [_arg(0, "SCMP_CMP_EQ", family),
                          _arg(2, "SCMP_CMP_EQ", _NETLINK_AUDIT)]},
            ]
        else:
            rules.append({"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                          "args": [_arg(0, "SCMP_CMP_EQ", family)]})
    rules.append({"names": ["socketpair"], "action": "SCMP_ACT_ALLOW",
                  "args": [_arg(0, "SCMP_CMP_EQ", int(socket.AF_UNIX))]})
    for name, families in (("socket", SOCKET_FAMILIES), ("socketpair", (int(socket.AF_UNIX),))):
        rules += [
            {"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EAFNOSUPPORT,
             "args": [arg]}
            for arg in _other_values(0, families)
        ]
    return rules


def _other_values(index: int, allowed: Collection[int]) -> list[SeccompArg]:
    """Comparisons, one per rule, that together match every 64-bit value of argument
    ``index`` outside ``allowed`` and none inside.

    A rule may compare an argument only once, so each gap between allowed values is cut
    into aligned power-of-two blocks (a masked compare each), and one ``>=`` takes all
    above the largest (high bits set included: the kernel would drop them, we do not).
    """
    comparisons: list[SeccompArg] = []
    low = 0
    for high in sorted(set(allowed)):
        while low < high:
            size = 1 << ((high - low).bit_length() - 1)
            while low % size:
                size //= 2
            if size == 1:
                comparisons.append(_arg(index, "SCMP_CMP_EQ", low))
            else:
                comparisons.append(_arg(index, "SCMP_CMP_MASKED_EQ", _U64 & ~(size - 1), low))
            low += size
        low = high + 1
    comparisons.append(_arg(index, "SCMP_CMP_GE", low))
    return comparisons
