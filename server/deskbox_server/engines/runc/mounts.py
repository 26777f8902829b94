"""A sandbox's mounts, as its ``config.json`` says they must be, checked against the kernel.

runc makes every mount of a fresh sandbox from its config. A checkpoint restore does not:
CRIU re-creates the mounts it dumped, and gets some of them wrong — the root comes back
read-write (criu#2632) and runc maps the masked files (``/proc/keys`` ...) to the host's
``/dev/null`` instead of the sandbox's own. :func:`repair_commands` lists what puts a
restored sandbox's mounts back, :func:`mismatches` says where the mount table of a sandbox
(``/proc/<pid>/mountinfo``) differs from its config, and the restore fails unless there is
no difference.

What is compared, per mount point: that a mount is there (and no mount that the config
does not make), read-only or read-write, ``nosuid``/``nodev``/``noexec`` where the config
sets them, the file system type of the non-bind mounts, and for a masked file that it is
the sandbox's own ``/dev/null`` (the device of its ``/dev``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .layout import RuntimeConfig

__all__ = [
    "MountEntry",
    "Repair",
    "mismatches",
    "parse_mountinfo",
    "repair_commands",
    "signature",
]

_SECURITY_FLAGS = ("nosuid", "nodev", "noexec")
# In a user namespace a sandbox cannot make device nodes: runc bind-mounts these of the
# host instead (its default devices), and the masked files are binds of that /dev/null.
_BOUND_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                  "/dev/tty")
# Paths runc masks or makes read-only exist only where the kernel has them; the sandbox
# runs on this host's kernel, so the host's own /proc and /sys say which do.
HOST_ROOT = Path("/")


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/<pid>/mountinfo``."""

    device: str  # major:minor of the file system
    root: str  # the path within the file system that is mounted (a bind's source)
    mountpoint: str
    options: frozenset[str]  # per-mount flags: ro/rw, nosuid, nodev, noexec, atime
    fstype: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        separator = fields.index("-")
        entries.append(MountEntry(
            device=fields[2], root=_unescape(fields[3]), mountpoint=_unescape(fields[4]),
            options=frozenset(fields[5].split(",")), fstype=fields[separator + 1],
        ))
    return entries


@dataclass(frozen=True)
class _Expected:
    read_only: bool
    flags: frozenset[str]
    fstype: str | None  # None: a bind mount, any type
    masks_file: bool = False


def _expected(config: RuntimeConfig, host_root: Path) -> dict[str, _Expected]:
    expected = {"/": _Expected(bool(config["root"].get("readonly")), frozenset(), None)}
    for mount in config["mounts"]:
        options = mount.get("options", [])
        bind = mount.get("type") == "bind" or "bind" in options or "rbind" in options
        expected[mount["destination"]] = _Expected(
            "ro" in options,
            frozenset(flag for flag in _SECURITY_FLAGS if flag in options),
            None if bind else mount.get("type"),
        )
    linux = config["linux"]
    if any(namespace["type"] == "user" for namespace in linux["namespaces"]):
        expected.update({device: _Expected(False, frozenset(), None)
                         for device in _BOUND_DEVICES})
    for path in linux.get("readonlyPaths", []):
        if (host_root / path.lstrip("/")).exists():
            expected[path] = _Expected(True, frozenset(), None)
    for path in linux.get("maskedPaths", []):
        host_path = host_root / path.lstrip("/")
        if host_path.is_dir():
            expected[path] = _Expected(True, frozenset(), "tmpfs")
        elif host_path.exists():
            expected[path] = _Expected(False, frozenset(), None, masks_file=True)
    return expected


def _top_mounts(entries: Sequence[MountEntry]) -> tuple[dict[str, MountEntry], list[str]]:
    """The visible (last) mount on each mount point, and the mount points used twice."""
    top: dict[str, MountEntry] = {}
    stacked: list[str] = []
    for entry in entries:
        if entry.mountpoint in top:
            stacked.append(entry.mountpoint)
        top[entry.mountpoint] = entry
    return top, stacked


def _null_device(top: dict[str, MountEntry]) -> tuple[str, str] | None:
    """(device, root) that a masked file of this sandbox must be: its own /dev/null, a
    node of its /dev or, in a user namespace, the bind runc made of the host's."""
    null = top.get("/dev/null")
    if null is not None:
        return null.device, null.root
    dev = top.get("/dev")
    return None if dev is None else (dev.device, "/null")


def mismatches(
    entries: Sequence[MountEntry], config: RuntimeConfig, host_root: Path = HOST_ROOT
) -> list[str]:
    """Where the mounts ``entries`` differ from ``config``; empty when they match."""
    expected = _expected(config, host_root)
    top, stacked = _top_mounts(entries)
    problems = [f"{path}: mounted more than once" for path in stacked]
    null = _null_device(top)
    for path, want in expected.items():
        entry = top.get(path)
        if entry is None:
            problems.append(f"{path}: not mounted")
            continue
        if entry.read_only != want.read_only:
            problems.append(f"{path}: {'rw' if want.read_only else 'ro'}, the config says "
                            f"{'ro' if want.read_only else 'rw'}")
        missing = want.flags - entry.options
        if missing:
            problems.append(f"{path}: without {', '.join(sorted(missing))}")
        if want.fstype is not None and entry.fstype != want.fstype:
            problems.append(f"{path}: {entry.fstype}, the config says {want.fstype}")
        if want.masks_file and (entry.device, entry.root) != null:
            problems.append(f"{path}: masked with {entry.fstype} {entry.device} "
                            f"{entry.root}, not the sandbox's own /dev/null")
    problems += [f"{path}: mounted, the config has no such mount"
                 for path in sorted(set(top) - set(expected))]
    return problems


# ("readonly-root", "/", its present flags) or ("mask", path, ()).
Repair = tuple[str, str, tuple[str, ...]]


def repair_commands(
    entries: Sequence[MountEntry], config: RuntimeConfig, host_root: Path = HOST_ROOT
) -> list[Repair]:
    """What makes a restored sandbox's root and masked files as its config says."""
    expected = _expected(config, host_root)
    top, _ = _top_mounts(entries)
    repairs: list[Repair] = []
    root = top.get("/")
    if root is not None and expected["/"].read_only and not root.read_only:
        repairs.append(("readonly-root", "/", tuple(sorted(root.options))))
    null = _null_device(top)
    for path, want in expected.items():
        entry = top.get(path)
        if want.masks_file and entry is not None and null is not None and (
            (entry.device, entry.root) != null
        ):
            repairs.append(("mask", path, ()))
    return repairs


def signature(entries: Iterable[MountEntry]) -> list[tuple[str, str, str, str]]:
    """What a mount table looks like to the sandbox, without device numbers or ids: for
    comparing a restored sandbox with a fresh one. (mount point, type, flags, root)."""
    top, _ = _top_mounts(list(entries))
    return sorted(
        (entry.mountpoint, entry.fstype, ",".join(sorted(entry.options)), entry.root)
        for entry in top.values()
    )
