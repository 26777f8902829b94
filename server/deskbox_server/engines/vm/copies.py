"""What a copy of a VM's snapshot (a create ``from_snapshot``, a fork's copy) may change.

A copy is the snapshot's QEMU migration stream read into a new QEMU, and QEMU takes a
migration only into the machine it was saved from: as many vCPUs and as much guest RAM.
The guest's own limit on its session's processes (``pids``, set by its /init at boot) is
in the memory it restores. What lies outside the guest, QEMU's CPU quota on the host, is
the copy's own, as ``resources.cpus`` is any session's.
"""

from __future__ import annotations

import dataclasses
import math

from ...errors import InvalidRequest
from ...schemas.sessions import Resources
from .qemu import VmConfig

__all__ = ["copy_config"]

_WHY = "a VM restored from memory keeps the machine it was saved with"


def copy_config(saved: VmConfig, resources: Resources | None) -> VmConfig:
    """The copy's shape: the snapshot's machine (``saved``) at the CPU quota ``resources``
    gives. A field ``resources`` leaves out (or all of it) is the snapshot's. InvalidRequest
    naming each field that would need another machine, before anything starts."""
    if resources is None:
        return saved
    asked = resources.model_fields_set
    refused = []
    # A quota above the vCPUs buys nothing a guest could use, and more vCPUs is another
    # machine; a smaller quota spreads over the snapshot's vCPUs.
    if "cpus" in asked and math.ceil(resources.cpus) > saved.cpus:
        refused.append(f"resources.cpus {resources.cpus:g} needs {math.ceil(resources.cpus)} "
                       f"vCPUs, and the snapshot's VM has {saved.cpus} (give cpus up to "
                       f"{saved.cpus}, or leave it out)")
    if "memory_mb" in asked and resources.memory_mb != saved.memory_mb:
        refused.append(f"resources.memory_mb {resources.memory_mb} is not the snapshot's "
                       f"{saved.memory_mb} MB of guest RAM (give {saved.memory_mb}, or leave "
                       "it out)")
    if "pids" in asked and resources.pids != saved.pids:
        limit, advice = (("none", "leave it out") if saved.pids is None
                         else (str(saved.pids), f"give {saved.pids}, or leave it out"))
        refused.append(f"resources.pids {resources.pids} is not the snapshot's limit "
                       f"({limit}), which its guest set when it booted ({advice})")
    if refused:
        raise InvalidRequest(f"{'; '.join(refused)}: {_WHY}")
    if "cpus" not in asked:
        return saved
    return dataclasses.replace(saved, cpu_quota=resources.cpus)
