"""Which accelerator a VM runs on: KVM where ``/dev/kvm`` runs a stock guest, else TCG.

A ``/dev/kvm`` that exists is not enough. Some hosts (this project's CI among them) offer
kvm-pvm, a paravirtualized KVM for guests built for it: the CPU has no vmx/svm, and a stock
Debian kernel hangs or dies of emulation failures under it. Asking QEMU to try would cost a
boot timeout per session, so the check is made once, from what the host says of itself,
and the reason is kept for ``GET /healthz``, the session and the log.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...errors import Internal

__all__ = ["Accelerator", "detect_accelerator"]

_KVM_GET_API_VERSION = 0xAE00
_KVM_API_VERSION = 12
_HARDWARE_FLAGS = frozenset({"vmx", "svm"})


@dataclass(frozen=True)
class Accelerator:
    name: Literal["kvm", "tcg"]
    reason: str
    # Under TCG the guest kernel calibrates its clock against emulated timers, which on a
    # busy host fails and hangs the boot for good: it is told the TSC's rate instead.
    tsc_khz: int | None = None

    @property
    def qemu_accel(self) -> str:
        # TCG: one translation thread per vCPU where the host has the cores for it.
        return "kvm" if self.name == "kvm" else "tcg,thread=multi"


def detect_accelerator(
    wanted: Literal["auto", "kvm", "tcg"] = "auto",
    kvm_device: Path = Path("/dev/kvm"),
    cpuinfo: Path = Path("/proc/cpuinfo"),
    modules: Path = Path("/sys/module"),
) -> Accelerator:
    """KVM when it is asked for or ``auto`` finds it usable, else TCG, with the reason.

    Internal when ``kvm`` is asked for and the host cannot give it.
    """
    if wanted == "tcg":
        return Accelerator("tcg", "software emulation (TCG), as configured",
                           _tsc_khz(cpuinfo))
    problem = _kvm_problem(kvm_device, cpuinfo, modules)
    if problem is None:
        return Accelerator("kvm", f"hardware virtualization ({kvm_device})")
    if wanted == "kvm":
        raise Internal(f"DESKBOX_VM_ACCELERATOR=kvm, but {problem} (auto: TCG here)")
    return Accelerator("tcg", f"software emulation (TCG): {problem}", _tsc_khz(cpuinfo))


def _kvm_problem(kvm_device: Path, cpuinfo: Path, modules: Path) -> str | None:
    """Why KVM cannot run a stock guest here, or None when it can."""
    try:
        fd = os.open(kvm_device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as error:
        return f"{kvm_device} cannot be opened ({error.strerror})"
    try:
        version = fcntl.ioctl(fd, _KVM_GET_API_VERSION)
    except OSError as error:
        return f"{kvm_device} does not answer KVM_GET_API_VERSION ({error.strerror})"
    finally:
        os.close(fd)
    if version != _KVM_API_VERSION:
        return f"{kvm_device} speaks KVM API {version}, not {_KVM_API_VERSION}"
    if (modules / "kvm_pvm").exists():
        return f"{kvm_device} is kvm-pvm, which runs only guests built for PVM"
    flags = _cpu_flags(cpuinfo)
    if flags is not None and not flags & _HARDWARE_FLAGS:
        return (f"the CPU offers no vmx or svm, so {kvm_device} is a paravirtual KVM "
                "(kvm-pvm) that a stock guest kernel cannot run on")
    return None


def _tsc_khz(cpuinfo: Path) -> int | None:
    """The host CPU's clock in kHz (``cpu MHz``), which TCG's TSC runs at."""
    value = _cpuinfo_field(cpuinfo, "cpu MHz")
    try:
        return round(float(value) * 1000) if value is not None else None
    except ValueError:
        return None


def _cpu_flags(cpuinfo: Path) -> frozenset[str] | None:
    value = _cpuinfo_field(cpuinfo, "flags")
    return frozenset(value.split()) if value is not None else None


def _cpuinfo_field(cpuinfo: Path, name: str) -> str | None:
    """The first CPU's ``name`` in /proc/cpuinfo, None where it is missing."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None
