"""Build the guest of the VM engine: Debian's kernel, an initramfs, and the session image.

The guest boots QEMU's ``microvm`` machine straight into the session. It is made of:

    vmlinux          Debian's kernel (the ``linux-image-*-amd64`` that ``linux-image-amd64``
                     depends on), uncompressed from its bzImage: an ELF with a PVH entry
                     note, which QEMU boots directly (``-kernel vmlinux``), skipping the
                     firmware's decompression (seconds under TCG)
    initramfs.cpio   uncompressed newc cpio: busybox (``busybox-static``), /init
                     (``vm_init.sh``), the kernel modules /init loads (lib/modules/<name>.ko,
                     uncompressed and unsigned, in the order of lib/modules/load.order,
                     dependencies first)
    rootfs.erofs     the session image build.py made (the same file the runc engine mounts):
                     a symbolic link to ``../<recipe hash>/rootfs.erofs``. Not a hard link:
                     linking changes the file's ctime, which image_store.check compares, so
                     every start would hash the whole image again; not a copy: gigabytes.
                     :func:`ensure_guest` ensures that image first, so the link resolves.
    manifest.json    kernel package and version, modules, sizes, built_at, the image's hash

cached as ``<state_dir>/images/vm-<hash>/``; the hash covers the session image's recipe
hash, this file, vm_init.sh, and the kernel's and busybox's package versions. The guest is
built in a temporary directory beside it and renamed into place, under a lock; one that
exists is never rebuilt.

What the host must give QEMU (the guest finds nothing else):

* ``-M microvm,acpi=on`` (the default): Debian's kernel finds virtio-mmio devices and
  fw_cfg only through ACPI (it is built without CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES and
  CONFIG_FW_CFG_SYSFS_CMDLINE, so ``acpi=off`` leaves it without disks or configuration).
* the root disk: ``-drive id=root,file=rootfs.erofs,format=raw,if=none,readonly=on``
  ``-device virtio-blk-device,drive=root,serial=deskbox-root`` (found by its serial);
* the kernel command line ``console=ttyS0 quiet panic=-1 tsc_early_khz=<host TSC kHz>``
  with ``-no-reboot`` and ``-serial file:console.log``. /init reports a failure in one
  line on the console, prefixed ``deskbox-init: error:``, and powers the VM off (QEMU
  exits); should anything end PID 1 later, the kernel panics, reboots at once and QEMU
  exits. ``tsc_early_khz``: under TCG the guest reads the host's TSC, and without that
  frequency the kernel calibrates it against the PIT, which fails on a busy host (the vCPU
  thread is preempted) or with ``pit=off``, and the boot then hangs for good before /init
  (the host's frequency: "cpu MHz" of /proc/cpuinfo where the CPU has constant_tsc and
  tsc_known_freq, as on this project's CI). ``deskbox.debug`` on the command line makes
  /init print the time of each of its steps;
* virtio-serial ports (``-device virtio-serial-device``, ``-device virtserialport,...,
  name=N``) appear in the guest as ``/dev/virtio-ports/N``;
* two fw_cfg files (``-fw_cfg name=opt/deskbox/env,file=PATH``, same for ``init``):

  ``opt/deskbox/env``: the environment of the session's PID 1
  (/usr/local/bin/deskbox-session), exactly: ``KEY=VALUE`` entries, each followed by one
  NUL byte (``b"".join(f"{k}={v}".encode() + b"\\0" ...)``). KEY matches
  ``[A-Za-z_][A-Za-z0-9_]*``; VALUE is any bytes but NUL (newlines are fine), e.g.
  ``DESKBOX_XSERVER=["Xvfb", ":0", ...]``. HOME also names the tmpfs home (default
  /root); nothing else is added (no PATH: deskbox-session sets its children's).

  ``opt/deskbox/init``: ``key=value`` lines (``\\n``-terminated, ASCII) for /init itself;
  every key is optional, an unknown key is an error:

      hostname=deskbox    letters, digits, '.', '-' (default deskbox)
      pids=512            pids.max of cgroup2 /session, which holds every process; 0: none
      tmp_mb=512          size of the tmpfs on /tmp      (mode 1777)
      run_mb=64           size of the tmpfs on /run      (mode 755)
      home_mb=512         size of the tmpfs on $HOME     (mode 700)
      shm_mb=256          size of the tmpfs on /dev/shm  (mode 1777, noexec)
      ports=deskbox-agent virtio-serial port names /init waits for (space-separated;
                          default: with a virtio-serial device, at least one port)
      net=none            none: loopback only; user: eth0 (virtio-net) as QEMU's user-mode
                          network expects it, 10.0.2.15/24 via 10.0.2.2
      volume=0:rw:/root/work  a session volume (repeatable): the ext4 virtio-blk disk with
                          serial deskbox-vol<index> (0-7), mounted ro or rw (nosuid, nodev)
                          on the path (under /root/ or /tmp/, plain names)

  Optional, with ``net=user``: ``opt/deskbox/hosts`` and ``opt/deskbox/resolv.conf``, the
  session's /etc/hosts and /etc/resolv.conf (bind-mounted read-only over the image's).

The session then runs as under runc: the erofs root read-only, those tmpfs (nosuid,
nodev), proc, sysfs (read-only), devtmpfs on /dev with devpts, mqueue; ``lo`` up.

Usage: ``python desktop_image/vm_guest.py [--state-dir DIR]``: progress on stderr, the
guest's directory as the last line on stdout (exit status 4 when the session image fails
its integrity check, as build.py).
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import build
import image_store

__all__ = [
    "GUEST_FILES",
    "INITRAMFS_FILE",
    "KERNEL_FILE",
    "MODULES",
    "Packages",
    "cpio_members",
    "ensure_guest",
    "extract_vmlinux",
    "guest_dir",
    "has_pvh_note",
    "main",
    "module_info",
    "resolve_packages",
    "strip_signature",
]

HERE = Path(__file__).resolve().parent
INIT_SCRIPT = HERE / "vm_init.sh"
KERNEL_META_PACKAGE = "linux-image-amd64"
APT_LISTS = Path("/var/lib/apt/lists")
BUSYBOX_PACKAGE = "busybox-static"
# What /init loads, in this order (each after its dependencies): the virtio-mmio bus that
# microvm's devices sit on, the root disk, the serial ports (the agent's channel), fw_cfg
# (the configuration), erofs (the root's file system), vsock (a host channel without
# chardevs, for the engine to use if it wants), virtio_net (the NIC of egress all and
# allowlist), ext4 (the session's volumes). Any that the kernel has built in is skipped.
MODULES = (
    "virtio_mmio", "virtio_blk", "virtio_console", "qemu_fw_cfg", "erofs",
    "vmw_vsock_virtio_transport", "virtio_net", "ext4",
)
KERNEL_FILE = "vmlinux"
INITRAMFS_FILE = "initramfs.cpio"
ROOT_DISK = image_store.IMAGE_FILE
MANIFEST = "manifest.json"
GUEST_FILES = (KERNEL_FILE, INITRAMFS_FILE, ROOT_DISK, MANIFEST)
MODULE_DIR = "lib/modules"  # in the initramfs: <name>.ko, flat
LOAD_ORDER = f"{MODULE_DIR}/load.order"

Progress = build.Progress


@dataclass(frozen=True)
class Packages:
    """The Debian packages a guest is made of: (name, version) each."""

    kernel: tuple[str, str]
    busybox: tuple[str, str]


# --- apt -------------------------------------------------------------------------------

def _run(argv: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        errors="replace", check=False,
        env={**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"},
    )


def _tail(done: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-lines:])


def _candidates() -> Packages | None:
    """The kernel and busybox packages apt would install, in one apt-cache call (a second
    where apt keeps no package cache, as in Docker's Debian images)."""
    done = _run(["apt-cache", "show", "--no-all-versions", KERNEL_META_PACKAGE,
                 BUSYBOX_PACKAGE])
    fields: dict[str, dict[str, str]] = {}
    for stanza in done.stdout.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if "Package" in lines:
            fields[lines["Package"]] = lines
    depends = fields.get(KERNEL_META_PACKAGE, {}).get("Depends", "")
    kernel = re.search(r"(linux-image-[^\s,]+) \(= ([^)\s]+)\)", depends)
    busybox = fields.get(BUSYBOX_PACKAGE, {}).get("Version")
    if done.returncode != 0 or kernel is None or busybox is None:
        return None
    return Packages((kernel.group(1), kernel.group(2)), (BUSYBOX_PACKAGE, busybox))


def _lists_signature() -> str:
    """Changes whenever apt's package lists do (apt-get update)."""
    digest = hashlib.sha256()
    try:
        with os.scandir(APT_LISTS) as entries:
            for entry in sorted(entries, key=lambda entry: entry.name):
                if entry.is_file():
                    info = entry.stat()
                    digest.update(f"{entry.name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    except OSError:
        return ""  # no lists: ask apt every time
    return digest.hexdigest()


def _cached_packages(cache: Path, signature: str) -> Packages | None:
    try:
        kept = json.loads(cache.read_text())
        if kept["lists"] != signature:
            return None
        kernel, busybox = kept["kernel"], kept["busybox"]
        return Packages((str(kernel[0]), str(kernel[1])), (str(busybox[0]), str(busybox[1])))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def resolve_packages(progress: Progress, cache: Path | None = None,
                     update: bool = True) -> Packages:
    """The current kernel and busybox packages by apt's lists (``apt-get update`` once when
    they know neither, and ``update``). ``cache``: a file that keeps the answer for as long
    as the lists stay the same."""
    signature = _lists_signature() if cache is not None else ""
    if signature and cache is not None and (kept := _cached_packages(cache, signature)):
        return kept
    packages = _candidates()
    if packages is None and update:
        progress("vm guest: apt knows no kernel or busybox package; running apt-get update")
        done = _run(["apt-get", "update", "-q"])
        if done.returncode != 0:
            raise RuntimeError(f"apt-get update failed with {done.returncode}:\n" + _tail(done))
        packages = _candidates()
        signature = _lists_signature() if cache is not None else ""
    if packages is None:
        raise RuntimeError(
            f"apt has no candidate for {KERNEL_META_PACKAGE} (naming its kernel package) or "
            f"{BUSYBOX_PACKAGE}: the VM guest needs Debian's package lists (apt-get update) "
            "and a mirror"
        )
    if cache is not None:
        record = {"lists": signature, "kernel": packages.kernel, "busybox": packages.busybox}
        temporary = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record) + "\n")
        os.replace(temporary, cache)
    return packages


def _download(packages: Iterable[tuple[str, str]], target: Path) -> list[Path]:
    wanted = [f"{name}={version}" for name, version in packages]
    # As root: the staging directory is not _apt's to write (apt warns and does it anyway).
    done = _run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *wanted],
                cwd=target)
    debs = sorted(target.glob("*.deb"))
    if done.returncode != 0 or len(debs) != len(wanted):
        raise RuntimeError(
            f"apt-get download {' '.join(wanted)} failed with {done.returncode}:\n"
            + _tail(done)
        )
    return debs


def _unpack(deb: Path, target: Path) -> None:
    done = _run(["dpkg-deb", "-x", str(deb), str(target)])
    if done.returncode != 0:
        raise RuntimeError(f"dpkg-deb -x {deb.name} failed:\n" + _tail(done))


# --- the kernel ------------------------------------------------------------------------

_XEN_ELFNOTE_PHYS32_ENTRY = 18  # the PVH entry point QEMU looks for
_PT_NOTE = 4


def extract_vmlinux(bzimage: bytes) -> bytes:
    """The uncompressed ELF kernel inside a bzImage (x86 boot protocol >= 2.08)."""
    if bzimage[0x202:0x206] != b"HdrS":
        raise RuntimeError("the kernel image is not an x86 bzImage (no HdrS header)")
    setup_sects = bzimage[0x1F1] or 4
    payload_offset, payload_length = struct.unpack_from("<II", bzimage, 0x248)
    start = (setup_sects + 1) * 512 + payload_offset
    payload = bzimage[start:start + payload_length]
    if payload.startswith(b"\xfd7zXZ\x00"):
        # One xz stream, followed by the 4-byte size the kernel build appends.
        vmlinux = lzma.LZMADecompressor(lzma.FORMAT_XZ).decompress(payload)
    elif payload.startswith(b"\x1f\x8b"):
        vmlinux = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(payload)
    elif payload.startswith(b"BZh"):
        vmlinux = bz2.BZ2Decompressor().decompress(payload)
    elif payload.startswith(b"\x28\xb5\x2f\xfd") and shutil.which("zstd"):
        vmlinux = subprocess.run(["zstd", "-dcq"], input=payload, capture_output=True,
                                 check=True).stdout
    else:
        raise RuntimeError(
            f"the kernel's payload is compressed in a way not handled here "
            f"(magic {payload[:6].hex()}): xz, gzip, bzip2, zstd (with the zstd program)"
        )
    if not vmlinux.startswith(b"\x7fELF"):
        raise RuntimeError("the kernel's decompressed payload is not an ELF file")
    return vmlinux


def has_pvh_note(elf: bytes) -> bool:
    """Whether a 64-bit ELF kernel has Xen's PHYS32_ENTRY note (PVH: QEMU boots it as is)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff = struct.unpack_from("<Q", elf, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for index in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + index * phentsize
        )
        if p_type != _PT_NOTE:
            continue
        position, end = p_offset, p_offset + p_filesz
        while position + 12 <= end:
            namesz, descsz, note_type = struct.unpack_from("<III", elf, position)
            name = elf[position + 12:position + 12 + namesz]
            if name.rstrip(b"\0") == b"Xen" and note_type == _XEN_ELFNOTE_PHYS32_ENTRY:
                return True
            position += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False


# --- kernel modules --------------------------------------------------------------------

def _module_name(path: Path) -> str:
    return path.name.split(".ko", 1)[0].replace("-", "_")


def _read_module(path: Path) -> bytes:
    """A module's ELF bytes, decompressed (insmod in the guest needs nothing more)."""
    data = path.read_bytes()
    if path.name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if path.name.endswith(".ko.gz"):
        return gzip.decompress(data)
    if path.name.endswith(".ko.zst"):
        if not shutil.which("zstd"):
            raise RuntimeError(f"{path.name} is zstd-compressed and zstd is not installed")
        return subprocess.run(["zstd", "-dcq", str(path)], capture_output=True,
                              check=True).stdout
    return data


_SIGNATURE_MAGIC = b"~Module signature appended~\n"


def strip_signature(module: bytes) -> bytes:
    """A module without its appended signature: checking it costs the guest ~0.25 s of
    its boot under TCG and proves nothing here (apt verified the package; the kernel,
    which does not enforce signatures, only notes that it is tainted)."""
    if not module.endswith(_SIGNATURE_MAGIC):
        return module
    # struct module_signature (12 bytes, the signature's length last, big-endian) precedes
    # the magic; the signature precedes that.
    end = len(module) - len(_SIGNATURE_MAGIC) - 12
    (length,) = struct.unpack_from(">I", module, end + 8)
    return module[:end - length]


def module_info(elf: bytes) -> dict[str, list[str]]:
    """The ``.modinfo`` section of a module: key -> values (``depends``, ``softdep``...)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise RuntimeError("not a 64-bit ELF kernel module")
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    info: dict[str, list[str]] = {}
    for name_index, _, _, _, offset, size in headers:
        end = elf.index(b"\0", names_offset + name_index)
        if elf[names_offset + name_index:end] != b".modinfo":
            continue
        for entry in elf[offset:offset + size].split(b"\0"):
            key, sep, value = entry.decode(errors="replace").partition("=")
            if sep:
                info.setdefault(key, []).append(value)
    return info


def _dependencies(info: dict[str, list[str]]) -> list[str]:
    names = [name for value in info.get("depends", []) for name in value.split(",") if name]
    for softdep in info.get("softdep", []):  # "pre: a b post: c": the pre: ones load first
        words = softdep.split()
        if "pre:" in words:
            for word in words[words.index("pre:") + 1:]:
                if word.endswith(":"):
                    break
                names.append(word)
    return [name.replace("-", "_") for name in names]


def _module_order(module_root: Path, wanted: Iterable[str]) -> tuple[list[str], dict[str, bytes]]:
    """Modules to load for ``wanted`` (dependencies first) and their bytes; built-ins left
    out. A soft dependency ("pre:") may be an alias: the module that declares it loads."""
    files = {_module_name(path): path for path in module_root.rglob("*.ko*")}
    builtin = {
        _module_name(Path(line.strip()))
        for line in (module_root / "modules.builtin").read_text().splitlines() if line.strip()
    }
    order: list[str] = []
    content: dict[str, bytes] = {}
    aliases: dict[str, list[str]] = {}

    def provider(alias: str) -> str | None:
        """The module a soft dependency's alias names (libcrc32c's "crc32c": the generic
        implementation before an optimized one), None if only built-ins provide it."""
        if not aliases:
            for name, path in sorted(files.items()):
                for value in module_info(_read_module(path)).get("alias", []):
                    aliases.setdefault(value.replace("-", "_"), []).append(name)
        candidates = aliases.get(alias, [])
        if not candidates or any(name in builtin for name in candidates):
            return None
        generic = [name for name in candidates if name.endswith("_generic")]
        return (generic or candidates)[0]

    def visit(name: str, chain: tuple[str, ...], soft: bool) -> None:
        if name in content or name in builtin:
            return
        if name in chain:
            raise RuntimeError(f"kernel modules depend on each other in a circle: {chain}")
        if name not in files and soft:
            found = provider(name)
            if found is None or found in content:  # ext4 and jbd2 both name "crc32c"
                return
            name = found
        if name not in files:
            raise RuntimeError(f"the kernel has no module {name} (needed by {chain or 'init'})")
        data = _read_module(files[name])
        info = module_info(data)
        hard = {dep for value in info.get("depends", []) for dep in value.split(",") if dep}
        for dependency in _dependencies(info):
            visit(dependency, chain + (name,), soft=dependency not in hard)
        content[name] = strip_signature(data)
        order.append(name)

    for name in wanted:
        visit(name, (), soft=False)
    return order, content


# --- the initramfs ---------------------------------------------------------------------

@dataclass(frozen=True)
class _Member:
    path: str
    mode: int  # with the file type bits
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def _cpio(members: Iterable[_Member]) -> bytes:
    """A newc ("070701") archive, as the kernel unpacks it; owner root, mtime 0."""
    out = bytearray()

    def add(path: str, mode: int, data: bytes, ino: int, rdev: tuple[int, int],
            nlink: int) -> None:
        name = path.encode() + b"\0"
        fields = (ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(name), 0)
        out.extend(b"070701" + b"".join(b"%08X" % field for field in fields) + name)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for ino, member in enumerate(members, 1):
        is_dir = member.mode & 0o170000 == 0o040000
        add(member.path, member.mode, member.data, ino, member.rdev, 2 if is_dir else 1)
    add("TRAILER!!!", 0, b"", 0, (0, 0), 1)
    return bytes(out)


def cpio_members(archive: bytes) -> dict[str, tuple[int, bytes]]:
    """path -> (mode, content) of a newc archive (symlinks: their target); for tests."""
    members: dict[str, tuple[int, bytes]] = {}
    position = 0
    while True:
        if archive[position:position + 6] != b"070701":
            raise ValueError(f"no newc header at offset {position}")
        fields = [int(archive[position + 6 + 8 * i:position + 14 + 8 * i], 16)
                  for i in range(13)]
        mode, size, name_size = fields[1], fields[6], fields[11]
        name_start = position + 110
        name = archive[name_start:name_start + name_size - 1].decode()
        data_start = name_start + name_size + (-(110 + name_size) % 4)
        if name == "TRAILER!!!":
            return members
        members[name] = (mode, archive[data_start:data_start + size])
        position = data_start + size + (-size % 4)


def _initramfs(busybox: bytes, init: bytes, modules: list[str],
               content: dict[str, bytes]) -> bytes:
    directories = ["bin", "dev", "proc", "sys", "newroot", "lib", MODULE_DIR]
    members = [_Member(path, 0o040755) for path in directories]
    members += [
        _Member("dev/console", 0o020600, rdev=(5, 1)),  # init's stdio before devtmpfs
        _Member("bin/busybox", 0o100755, busybox),
        _Member("bin/sh", 0o120777, b"busybox"),  # /init installs the other applets
        _Member("init", 0o100755, init),
        _Member(LOAD_ORDER, 0o100644, "".join(f"{name}\n" for name in modules).encode()),
    ]
    members += [_Member(f"{MODULE_DIR}/{name}.ko", 0o100644, content[name]) for name in modules]
    return _cpio(members)


# --- the guest -------------------------------------------------------------------------

def guest_hash(recipe: build.Recipe, packages: Packages) -> str:
    digest = hashlib.sha256()
    digest.update(f"rootfs\0{recipe.hash}\0".encode())
    digest.update(hashlib.sha256(Path(__file__).resolve().read_bytes()).digest())
    digest.update(hashlib.sha256(INIT_SCRIPT.read_bytes()).digest())
    for name, version in (packages.kernel, packages.busybox):
        digest.update(f"\0{name}={version}".encode())
    return digest.hexdigest()[:16]


def guest_dir(state_dir: Path, recipe: build.Recipe, packages: Packages) -> Path:
    return state_dir / "images" / f"vm-{guest_hash(recipe, packages)}"


def ensure_guest(state_dir: Path, progress: Progress = print) -> Path:
    """The directory of the current guest (the files in the module doc), built if missing;
    the session image (build.ensure_image) first. ImageIntegrityError as build.py's."""
    recipe = build.load_recipe()
    build.ensure_image(state_dir, recipe, progress)
    packages = resolve_packages(progress, state_dir / "images" / ".vm-packages.json")
    final = guest_dir(state_dir, recipe, packages)
    return build.cached_or_built(
        final, MANIFEST, "vm guest",
        lambda: _build(final.parent, final, recipe, packages, progress), progress)


def _build(images: Path, final: Path, recipe: build.Recipe, packages: Packages,
           progress: Progress) -> None:
    started = time.monotonic()
    name = final.name
    with build._staging(images, name) as staging:
        debs = staging / "debs"
        debs.mkdir()
        progress(f"vm guest {name}: downloading {packages.kernel[0]} {packages.kernel[1]} "
                 f"and {packages.busybox[0]} {packages.busybox[1]}")
        unpacked = staging / "unpacked"
        for deb in _download((packages.kernel, packages.busybox), debs):
            _unpack(deb, unpacked)
        module_roots = sorted((unpacked / "lib/modules").iterdir())
        if len(module_roots) != 1:
            raise RuntimeError(f"{packages.kernel[0]} holds {len(module_roots)} module trees")
        release = module_roots[0].name

        progress(f"vm guest {name}: uncompressing the kernel {release}")
        vmlinux = extract_vmlinux((unpacked / "boot" / f"vmlinuz-{release}").read_bytes())
        if not has_pvh_note(vmlinux):
            raise RuntimeError(f"the kernel {release} has no PVH entry note (CONFIG_PVH): "
                               "QEMU cannot boot it as an ELF")
        (staging / KERNEL_FILE).write_bytes(vmlinux)

        modules, content = _module_order(module_roots[0], MODULES)
        progress(f"vm guest {name}: initramfs with busybox and {len(modules)} modules "
                 f"({', '.join(modules)})")
        busybox = (unpacked / "bin/busybox").read_bytes()
        initramfs = _initramfs(busybox, INIT_SCRIPT.read_bytes(), modules, content)
        (staging / INITRAMFS_FILE).write_bytes(initramfs)

        image = build.image_dir(images.parent, recipe)
        os.symlink(f"../{image.name}/{ROOT_DISK}", staging / ROOT_DISK)
        image_manifest = json.loads((image / image_store.MANIFEST).read_text())
        for part in (KERNEL_FILE, INITRAMFS_FILE):
            (staging / part).chmod(0o444)
        manifest = {
            "hash": final.name.removeprefix("vm-"),
            "kernel": {"package": packages.kernel[0], "version": packages.kernel[1],
                       "release": release, "size": len(vmlinux), "pvh": True},
            "busybox": {"package": packages.busybox[0], "version": packages.busybox[1]},
            "modules": modules,
            "initramfs": {"size": len(initramfs), "format": "newc, uncompressed"},
            "rootfs": {"image_hash": recipe.hash, "file": f"../{image.name}/{ROOT_DISK}",
                       "size": image_manifest["image"]["size"],
                       "sha256": image_manifest["image"]["sha256"]},
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(debs)
        shutil.rmtree(unpacked)
        os.rename(staging, final)
    progress(f"vm guest {name} ready in {time.monotonic() - started:.1f} s: {final}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--state-dir", type=Path,
        default=Path(os.environ.get("DESKBOX_STATE_DIR", HERE.parent / ".state")),
    )
    args = parser.parse_args(argv)
    return build.made_from_image(ensure_guest, args.state_dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
