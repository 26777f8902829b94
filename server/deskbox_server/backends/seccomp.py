"""The seccomp profile of a session sandbox, in the OCI runtime spec's JSON shape.

Default allow with a denylist: the sandbox runs an X server, a window manager, Chromium
(``--no-sandbox``) and whatever an agent runs through ``exec``, so an allowlist would have to
follow every program an agent may start. The denylist removes what a desktop never needs and
what widens the kernel's attack surface: mounting, module and kexec loading, tracing other
processes, BPF, keyrings, perf, userfaultfd, io_uring, clock changes, handle-based opens,
and creating user namespaces (the door to every other namespace without capabilities).

Only the native x86-64 ABI is listed, so 32-bit (int 0x80) and x32 system calls, which a
denylist by name would have to repeat, fail as a bad architecture.
"""

from __future__ import annotations

import errno
from typing import TypedDict

__all__ = ["DENIED_SYSCALLS", "SeccompProfile", "seccomp_profile"]

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

_CLONE_NEWUSER = 0x10000000


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
    architectures: list[str]
    syscalls: list[SyscallRule]


def seccomp_profile() -> SeccompProfile:
    newuser: SeccompArg = {
        "index": 0, "value": _CLONE_NEWUSER, "valueTwo": _CLONE_NEWUSER,
        "op": "SCMP_CMP_MASKED_EQ",
    }
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO",
             "errnoRet": errno.EPERM},
            # clone's and unshare's first argument holds the namespace flags.
            {"names": ["unshare", "clone"], "action": "SCMP_ACT_ERRNO",
             "errnoRet": errno.EPERM, "args": [newuser]},
            # clone3 passes its flags in memory seccomp cannot read: report it missing, so
            # libc falls back to clone, whose flags we can check.
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
        ],
    }
