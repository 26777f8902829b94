"""QEMU's command line for one session's microVM, and the files the guest is made of.

The guest (built by desktop_image/vm_guest.py, cached by recipe hash beside the container
image) is Debian's kernel, an initramfs whose /init (desktop_image/vm_init.sh) mounts the
session image read-only with tmpfs for the writable paths, and the session image itself
(``rootfs.erofs``, the same file the runc engine mounts). The session's settings reach the
guest through QEMU's fw_cfg, never through a shared directory: ``opt/deskbox/env`` (the
environment of the session's init, NUL-separated ``KEY=VALUE``), ``opt/deskbox/init``
(``key=value`` lines for /init itself: hostname, pids, tmpfs sizes, network) and, with a
NIC, ``opt/deskbox/hosts`` and ``opt/deskbox/resolv.conf``.

Only unix sockets in the session's runtime directory lead out of QEMU: QMP and the agent's
virtio-serial port. No monitor, VNC or other port on TCP; ``-nodefaults`` and
``-sandbox`` (seccomp) as Firecracker's jailer would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...errors import Internal
from .accel import Accelerator

__all__ = [
    "AGENT_PORT",
    "AGENT_PORT_ID",
    "GuestImage",
    "VmConfig",
    "VmPaths",
    "guest_files",
    "qemu_argv",
]

AGENT_PORT = "deskbox-agent"  # the virtio-serial port's name in the guest
AGENT_PORT_ID = "agent-port"  # its QEMU device id (QMP's VSERPORT_CHANGE names it)
QEMU = "qemu-system-x86_64"
# What QEMU itself needs beside the guest's RAM (its code, TCG's translation cache, device
# buffers): the cgroup memory limit is the guest's RAM plus this.
QEMU_OVERHEAD_MB = 384


@dataclass(frozen=True)
class GuestImage:
    """The files of one built guest (``images/vm-<hash>/``), read-only to QEMU."""

    directory: Path

    @property
    def kernel(self) -> Path:
        return self.directory / "vmlinux"

    @property
    def initramfs(self) -> Path:
        return self.directory / "initramfs.cpio"

    @property
    def root_disk(self) -> Path:
        # A symbolic link to the session image's own file (vm_guest.py): QEMU, jailed, is
        # given the file itself.
        return (self.directory / "rootfs.erofs").resolve()

    @property
    def files(self) -> list[Path]:
        return [self.kernel, self.initramfs, self.root_disk]

    @property
    def hash(self) -> str:
        return self.directory.name.removeprefix("vm-")

    @classmethod
    def from_directory(cls, directory: Path) -> GuestImage:
        image = cls(directory)
        for part in (image.kernel, image.initramfs, image.root_disk):
            if not part.is_file():
                raise Internal(f"the VM guest in {directory} lacks {part.name}: rebuild it "
                               "(remove the directory; the server builds it again)")
        return image


@dataclass(frozen=True)
class VmConfig:
    """One VM's shape (already validated wire values)."""

    cpus: int = 1  # vCPUs
    cpu_quota: float = 1.0  # host CPUs' worth of time for all of QEMU's threads
    memory_mb: int = 2048
    pids: int | None = None
    hostname: str = "deskbox"
    egress: str = "none"  # none: no NIC at all; all, allowlist: slirp in the host's netns
    tmp_mb: int = 512
    run_mb: int = 64
    home_mb: int = 512
    shm_mb: int = 256
    # The session's volumes, each a virtio-blk disk the guest's /init mounts.
    volumes: tuple[VmVolume, ...] = ()

    @property
    def cgroup_memory_bytes(self) -> int:
        return (self.memory_mb + QEMU_OVERHEAD_MB) << 20

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "volumes": [v.__dict__ for v in self.volumes]})

    @classmethod
    def from_json(cls, text: str) -> VmConfig:
        fields = json.loads(text)
        volumes = tuple(VmVolume(**v) for v in fields.pop("volumes", []))
        return cls(**fields, volumes=volumes)


@dataclass(frozen=True)
class VmVolume:
    """A volume's disk image on the host and where the guest mounts it (a path under
    /root/ or /tmp/ of plain names: schemas/volumes.py)."""

    disk: str
    path: str
    read_only: bool = False

    @property
    def access_modes(self) -> tuple[int, ...]:
        """How QEMU opens the disk: read-only, or read-write and read-only too (it probes
        the image read-only first and takes, from the descriptors it was given, one opened
        with the access it asks for)."""
        return (os.O_RDONLY,) if self.read_only else (os.O_RDWR, os.O_RDONLY)


@dataclass(frozen=True)
class VmPaths:
    """Where one VM's files live: its runtime directory holds only what QEMU may touch."""

    runtime: Path

    @property
    def qmp(self) -> Path:
        return self.runtime / "qmp.sock"

    @property
    def agent(self) -> Path:
        return self.runtime / "agent.sock"

    @property
    def console(self) -> Path:
        return self.runtime / "console.log"

    def fw_cfg(self, name: str) -> Path:
        return self.runtime / f"fw_cfg.{name}"

    @property
    def qemu_log(self) -> Path:
        return self.runtime / "qemu.log"

    @property
    def pid(self) -> Path:
        return self.runtime / "qemu.pid"


def guest_files(
    config: VmConfig, env: Mapping[str, str], net_files: Mapping[str, str] | None = None
) -> dict[str, bytes]:
    """The fw_cfg files ``opt/deskbox/<name>`` by name (see the module doc); with a NIC also
    ``hosts`` and ``resolv.conf`` (``net_files``; placeholders for a restore, whose guest
    has them already: a restored machine must have the files the saved one had)."""
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise Internal(f"the session's environment entry {key!r} cannot reach the guest")
    env_bytes = b"".join(f"{key}={value}".encode() + b"\0" for key, value in env.items())
    lines = {
        "hostname": config.hostname,
        "pids": str(config.pids or 0),
        "tmp_mb": str(config.tmp_mb),
        "run_mb": str(config.run_mb),
        "home_mb": str(config.home_mb),
        "shm_mb": str(config.shm_mb),
        "net": "none" if config.egress == "none" else "user",
    }
    # One line each, "volume=<disk index>:<ro|rw>:<path>" (/init finds the disk by its
    # serial, deskbox-vol<index>).
    volume_lines = "".join(
        f"volume={index}:{'ro' if volume.read_only else 'rw'}:{volume.path}\n"
        for index, volume in enumerate(config.volumes))
    files = {
        "env": env_bytes,
        "init": ("".join(f"{key}={value}\n" for key, value in lines.items())
                 + volume_lines).encode(),
    }
    if config.egress != "none":
        for name in ("hosts", "resolv.conf"):
            files[name] = (net_files or {}).get(name, "\n").encode()
    return files


def kernel_cmdline(accel: Accelerator) -> str:
    # panic=-1 with -no-reboot: should the guest's PID 1 die, QEMU exits at once.
    cmdline = "console=ttyS0 quiet panic=-1"
    if accel.tsc_khz is not None:
        cmdline += f" tsc_early_khz={accel.tsc_khz}"
    return cmdline


def qemu_argv(
    image: GuestImage, config: VmConfig, paths: VmPaths, accel: Accelerator,
    fw_cfg: Collection[str], incoming_fd: int | None = None,
    volume_fds: Sequence[Sequence[int]] = (),
) -> list[str]:
    """The whole command line; ``fw_cfg``: the names of the guest's files in ``paths``;
    ``incoming_fd``: restore from the migration stream on it; ``volume_fds``: the disk
    image of each of ``config.volumes``, opened in each of its ``access_modes`` (QEMU,
    jailed, sees no volume's file: it gets descriptors the server opened)."""
    argv = [
        QEMU,
        "-name", "deskbox,debug-threads=on",
        # Debian's kernel finds microvm's virtio-mmio devices and fw_cfg through ACPI only.
        "-M", "microvm,acpi=on,pit=off,pic=off,rtc=on,isa-serial=on",
        "-accel", accel.qemu_accel,
        "-cpu", "host" if accel.name == "kvm" else "max",
        "-smp", str(config.cpus),
        "-m", f"{config.memory_mb}M",
        "-nodefaults", "-no-user-config", "-nographic",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-kernel", str(image.kernel),
        "-initrd", str(image.initramfs),
        "-append", kernel_cmdline(accel),
        "-no-reboot",
        "-drive", f"id=root,file={image.root_disk},format=raw,if=none,readonly=on",
        "-device", "virtio-blk-device,drive=root,serial=deskbox-root",
        "-device", "virtio-serial-device,max_ports=2",
        "-chardev", f"socket,id=agent,path={paths.agent},server=on,wait=off",
        "-device", f"virtserialport,id={AGENT_PORT_ID},chardev=agent,name={AGENT_PORT}",
        "-serial", f"file:{paths.console}",
        "-qmp", f"unix:{paths.qmp},server=on,wait=off",
    ]
    for name in fw_cfg:
        argv += ["-fw_cfg", f"name=opt/deskbox/{name},file={paths.fw_cfg(name)}"]
    for index, (volume, fds) in enumerate(zip(config.volumes, volume_fds, strict=True)):
        readonly = "on" if volume.read_only else "off"
        for fd in fds:
            argv += ["-add-fd", f"fd={fd},set={index + 1}"]
        # file.locking=off: the server's attachments (one writer, or readers) are the
        # lock; QEMU's own, on the descriptors it was given, refused a restored guest its
        # disk when it activated it after the migration ("Failed to get shared write lock").
        argv += ["-drive", f"id=vol{index},file=/dev/fdset/{index + 1},format=raw,if=none,"
                           f"readonly={readonly},file.locking=off",
                 "-device", f"virtio-blk-device,drive=vol{index},serial=deskbox-vol{index}"]
    if config.egress != "none":
        # QEMU's user-mode network runs in the host-made network namespace QEMU was started
        # in: the guest's connections become QEMU's sockets there, which its nftables
        # rules filter and pasta carries out (engines/network.py).
        argv += ["-netdev", "user,id=net0,net=10.0.2.0/24,host=10.0.2.2,ipv6=off",
                 "-device", "virtio-net-device,netdev=net0"]
    if incoming_fd is not None:
        argv += ["-incoming", f"fd:{incoming_fd}"]
    return argv
